#!/usr/bin/env python3
"""Soak and fault campaign for the watchdog (the code is ``rigs/soak.py``, which the CI-size test also runs).

    python bench/watchdog_soak.py [--minutes 30] [--faults 20] [--seed 1] [--json]
    python bench/watchdog_soak.py --seat local-sglang [--minutes 30] [--faults 5]

Every engine figure of the sim soak is SYNTHETIC. ``--seat local-sglang`` soaks real SGLang (bench/realsoak.py).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rigs import soak


def _real_main(a: argparse.Namespace) -> int:
    """The soak on real SGLang (bench/realsoak.py): two rehearsal seats, with and without --sleep-on-idle."""
    import realsoak

    work = Path(tempfile.mkdtemp(prefix="watchdog-realsoak-"))

    def log(msg: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)

    try:
        rep = realsoak.run(a.minutes, 5 if a.faults is None else a.faults, a.seed, work, log)
    finally:
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)
    print(realsoak.table(rep, a.minutes))
    if a.json:
        print(json.dumps(rep.__dict__, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(soak.main(real=_real_main))
