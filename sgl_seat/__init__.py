"""sgl-seat: plan, bring up, watch, capture and replay one multi-node SGLang MoE seat."""

from sgl_seat import envcompat as _envcompat

__version__ = "0.1.0"

# Before anything reads the environment: this project's variables under their old names (before issue 49) become
# SGLSEAT_*, with a warning (envcompat says why).
_envcompat.migrate()
