"""sgl-seat: plan, bring up, watch, capture and replay one multi-node SGLang MoE seat."""

__version__ = "0.1.0"
