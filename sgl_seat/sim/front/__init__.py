"""Node 0's HTTP front: the SGLang-compatible API, the tokenizer-manager stand-in, metrics, logs, fault admin."""
