"""Tiny models made here, for rehearsing a real SGLang seat on a machine with no GPU and no model hub.

Why: no model can be downloaded on the machines sgl-seat is tested on, and a real SGLang server needs a model
directory: a ``config.json`` of an architecture SGLang knows, and a tokenizer. SGLang's ``--load-format dummy``
fills the weights with random values itself, so a directory with a config and a tokenizer is enough for the
real CPU engine to serve (``../shared/reference/sglang-cpu.md``, "Tiny models").

The tokenizer is a byte-level BPE trained in about a second with Hugging Face ``tokenizers`` on a corpus this
module generates from a seed, so the same seed gives the same files, byte for byte. It carries a chat template
(for ``/v1/chat/completions``) and ``<|endoftext|>`` as its end and pad token.

Standard library plus ``tokenizers`` (imported when a model is made). The file also runs as a script
(``python tinymodel.py DIR --arch llama``), so an engine environment without sgl-seat installed can make one.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import sys
from typing import Any

ARCHS = ("llama", "qwen3moe")
#: The one special token: end of text and padding (SGLang stops on it).
EOS = "<|endoftext|>"
VOCAB_SIZE = 1024
#: ChatML, as Qwen's tokenizers write it: the chat route renders messages with it.
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIALS = (EOS, "<|im_start|>", "<|im_end|>")

_COMMON: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "vocab_size": VOCAB_SIZE,
    "bos_token_id": 0,
    "eos_token_id": 0,
    "pad_token_id": 0,
    "hidden_act": "silu",
    "attention_bias": False,
    "initializer_range": 0.02,
}


def config_for(arch: str) -> dict[str, Any]:
    """The ``config.json`` of a tiny model of ``arch`` (``llama`` or ``qwen3moe``: 4 experts, top 2)."""
    if arch == "llama":
        return {**_COMMON, "architectures": ["LlamaForCausalLM"], "model_type": "llama"}
    if arch == "qwen3moe":
        return {
            **_COMMON, "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
            "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 64, "decoder_sparse_step": 1,
            "norm_topk_prob": True, "mlp_only_layers": [], "output_router_logits": False,
            "router_aux_loss_coef": 0.001, "use_sliding_window": False, "sliding_window": None,
        }
    raise ValueError(f"unknown architecture {arch!r}: one of {', '.join(ARCHS)}")


def corpus(seed: int, lines: int = 2000) -> list[str]:
    """Training text for the tokenizer: seeded pseudo-words and the chat markup, the same for the same seed."""
    rng = random.Random(seed)  # noqa: S311 (seeded text for a tokenizer, not secrets)
    letters = "abcdefghijklmnopqrstuvwxyz"
    words = ["".join(rng.choice(letters) for _ in range(rng.randint(2, 8))) for _ in range(400)]
    words += ["the", "seat", "rank", "node", "scheduler", "decode", "prefill", "token", "draft", "hang"]
    out = []
    for _ in range(lines):
        out.append(" ".join(rng.choice(words) for _ in range(rng.randint(4, 16))) + rng.choice(".!?,"))
    return out


def tokenizer_json(seed: int) -> str:
    """A byte-level BPE tokenizer (``tokenizer.json`` text) trained on :func:`corpus`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(  # type: ignore[no-untyped-call]
        vocab_size=VOCAB_SIZE, special_tokens=list(SPECIALS), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus(seed), trainer=trainer)
    text: str = tok.to_str()
    return text


def tokenizer_config() -> dict[str, Any]:
    return {
        "tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 4096, "eos_token": EOS,
        "pad_token": EOS, "bos_token": None, "unk_token": None, "add_bos_token": False,
        "chat_template": CHAT_TEMPLATE, "clean_up_tokenization_spaces": False,
    }


def make(directory: str, arch: str = "llama", seed: int = 0) -> dict[str, str]:
    """Write a tiny model of ``arch`` into ``directory``; returns each file's sha256 (deterministic per seed)."""
    files = {
        "config.json": json.dumps(config_for(arch), indent=2, sort_keys=True) + "\n",
        "generation_config.json": json.dumps({"eos_token_id": 0, "pad_token_id": 0, "do_sample": False},
                                             indent=2, sort_keys=True) + "\n",
        "tokenizer.json": tokenizer_json(seed),
        "tokenizer_config.json": json.dumps(tokenizer_config(), indent=2, sort_keys=True) + "\n",
        "special_tokens_map.json": json.dumps({"eos_token": EOS, "pad_token": EOS}, indent=2, sort_keys=True) + "\n",
        "sgl-seat-tiny.json": json.dumps({"arch": arch, "seed": seed, "weights": "none: serve with --load-format "
                                          "dummy (SGLang fills them with random values)"}, indent=2) + "\n",
    }
    os.makedirs(directory, exist_ok=True)
    sums = {}
    for name, text in files.items():
        data = text.encode()
        tmp = os.path.join(directory, f".{name}.tmp")
        with open(tmp, "wb") as fh:
            fh.write(data)
        os.replace(tmp, os.path.join(directory, name))
        sums[name] = hashlib.sha256(data).hexdigest()
    return sums


def is_tiny_model(directory: str) -> bool:
    """True when ``directory`` holds a model this module made (its marker file is there)."""
    return os.path.isfile(os.path.join(directory, "sgl-seat-tiny.json"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("directory")
    ap.add_argument("--arch", choices=ARCHS, default="llama")
    ap.add_argument("--seed", type=int, default=0)
    ns = ap.parse_args(argv)
    sums = make(ns.directory, ns.arch, ns.seed)
    json.dump({"directory": os.path.abspath(ns.directory), "arch": ns.arch, "seed": ns.seed, "sha256": sums},
              sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
