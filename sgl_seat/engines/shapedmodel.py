"""A model shaped by a seat's planning config (an 8B-shaped Llama on a GPU), made like the tiny ones: config and
tokenizer, no weights (SGLang's ``--load-format dummy`` fills them with random values).

Why beside :mod:`.tinymodel` rather than in it: the tiny models' files are part of the CPU engine environment's
stamp (``scripts/install-sglang-engine.sh`` hashes that module), and a GPU seat's shape has no bearing on them.
The tokenizer is the tiny one's (1024 tokens), so the config's ``vocab_size`` must be 1024.

Standard library plus ``tokenizers``; also runs as a script (``python shapedmodel.py DIR --config FILE``) in an
engine environment without sgl-seat, as :mod:`.tinymodel` does.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from typing import Any

if __package__:
    from sgl_seat.engines import tinymodel
else:  # run as a file: its neighbour is on sys.path[0]
    import tinymodel  # type: ignore[no-redef,import-not-found]


def shaped_config(path: str) -> dict[str, Any]:
    """The config.json at ``path`` (a file or a directory holding one), checked against the made tokenizer."""
    if os.path.isdir(path):
        path = os.path.join(path, "config.json")
    with open(path, encoding="utf-8") as fh:
        cfg = json.load(fh)
    if not isinstance(cfg, dict) or not cfg.get("architectures"):
        raise ValueError(f"{path}: not a model config.json (no architectures)")
    if int(cfg.get("vocab_size") or 0) != tinymodel.VOCAB_SIZE:
        raise ValueError(f"{path}: vocab_size {cfg.get('vocab_size')} is not the made tokenizer's "
                         f"{tinymodel.VOCAB_SIZE}")
    return cfg


def make(directory: str, config: str, seed: int = 0) -> dict[str, str]:
    """Write the model into ``directory``; returns each file's sha256 (the same for the same config and seed)."""
    cfg = shaped_config(config)
    sums = tinymodel.make(directory, "llama", seed)
    files = {
        "config.json": json.dumps(cfg, indent=2, sort_keys=True) + "\n",
        "sgl-seat-tiny.json": json.dumps({"arch": str(cfg["architectures"][0]), "seed": seed,
                                          "shaped_by": os.path.abspath(config), "weights": "none: serve with "
                                          "--load-format dummy (SGLang fills them with random values)"},
                                         indent=2) + "\n",
    }
    for name, text in files.items():
        data = text.encode()
        tmp = os.path.join(directory, f".{name}.tmp")
        with open(tmp, "wb") as fh:
            fh.write(data)
        os.replace(tmp, os.path.join(directory, name))
        sums[name] = hashlib.sha256(data).hexdigest()
    return sums


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("directory")
    ap.add_argument("--config", required=True, help="config.json (or its directory) to shape the model by")
    ap.add_argument("--seed", type=int, default=0)
    ns = ap.parse_args(argv)
    sums = make(ns.directory, ns.config, ns.seed)
    arch = str(shaped_config(ns.config)["architectures"][0])
    json.dump({"directory": os.path.abspath(ns.directory), "arch": arch, "seed": ns.seed, "sha256": sums},
              sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
