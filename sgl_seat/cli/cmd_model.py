"""`sgl-seat model tiny`: make a tiny model to rehearse a real SGLang seat on a machine without GPUs."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Annotated

import typer

from sgl_seat.cli.common import print_json
from sgl_seat.engines import tinymodel
from sgl_seat.engines.base import engine_venv
from sgl_seat.errors import UsageError

app = typer.Typer(help="Models for rehearsals: `tiny` makes one locally (config and tokenizer; weights random).",
                  no_args_is_help=True)


@app.command("tiny")
def tiny(
    directory: Annotated[Path, typer.Argument(help="Where to write the model (made if missing).")],
    arch: Annotated[str, typer.Option("--arch", help="llama (LlamaForCausalLM) or qwen3moe (4 experts, top 2).")]
    = "llama",
    seed: Annotated[int, typer.Option("--seed", help="The same seed gives the same files, byte for byte.")] = 0,
    json_out: Annotated[bool, typer.Option("--json", help="Print the files' sha256 as JSON.")] = False,
) -> None:
    """Write a tiny model SGLang serves with `--load-format dummy`: config.json, a byte-level BPE tokenizer trained
    in a second (with a chat template) and no weights. The local-sglang seat uses one made at setup."""
    if arch not in tinymodel.ARCHS:
        raise UsageError(f"--arch {arch!r} is not one of {', '.join(tinymodel.ARCHS)}", fix="pass --arch llama")
    if importlib.util.find_spec("tokenizers") is not None:
        sums = tinymodel.make(str(directory), arch, seed)
    else:  # the engine's environment has tokenizers (SGLang needs it): make the model there
        python = Path(engine_venv()) / "bin" / "python"
        if not python.is_file():
            raise UsageError("making a tiny model needs the `tokenizers` package, which neither this interpreter nor"
                             f" the engine environment ({python}) has",
                             fix="bash scripts/setup.sh --engine sglang, or pip install tokenizers")
        res = subprocess.run([str(python), tinymodel.__file__, str(directory), "--arch", arch, "--seed", str(seed)],
                             capture_output=True, text=True, timeout=300, check=False)
        if res.returncode != 0:
            raise UsageError(f"making the tiny model failed: {res.stderr.strip()[-500:]}", fix="see the error above")
        sums = json.loads(res.stdout)["sha256"]
    if json_out:
        print_json({"directory": str(directory.resolve()), "arch": arch, "seed": seed, "sha256": sums})
        return
    sys.stdout.write(f"tiny {arch} model (seed {seed}) in {directory.resolve()}: {', '.join(sorted(sums))}\n"
                     "serve it with SGLang's --load-format dummy (random weights: its answers are noise)\n")
