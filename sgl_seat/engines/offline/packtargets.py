"""What an offline engine package holds for a named target image: the pinned wheels, what is left out and why.

A target is a GPU host's image as it is, with no package registry: its Python, its torch, its CUDA. The pins and
the trim rules below are the ones that ran real SGLang with the draft on an H200 of that image
(``../shared/reference/sglang-gpu.md`` in the project's notes; ``docs/gpu-validation.md`` gives the runs). A rule
names a path pattern under the package's site directory and the reason it may go; a rule that matches nothing is an
error at build time, so a new wheel that moves a file is noticed rather than silently carried.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class TrimRule:
    """Files under the site directory matching ``pattern`` (a ``Path.glob`` pattern) are left out."""

    pattern: str
    reason: str


@dataclass(frozen=True, slots=True)
class PackTarget:
    name: str
    description: str
    python: str  # "3.12": the target's interpreter, for pip's --python-version
    #: Wheel platform tags pip may pick for the target (every manylinux glibc the target's glibc runs).
    platforms: tuple[str, ...]
    pins: tuple[str, ...]
    trim: tuple[TrimRule, ...] = ()
    #: Shared objects whose debug sections are stripped (``strip --strip-debug``; the code is untouched).
    strip_debug: tuple[str, ...] = ()
    #: Python code the host runs with the package first on its path: it must print one JSON object and exit 0.
    check: str = ""
    #: What the host must set besides the package on PYTHONPATH (``{site}`` is the unpacked site directory).
    env: dict[str, str] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    #: Built from this checkout (``pip wheel --no-deps``) and carried beside the pins: sgl-seat itself.
    from_checkout: bool = False


def _manylinux(glibc_minor_max: int) -> tuple[str, ...]:
    tags = [f"manylinux_2_{m}_x86_64" for m in range(glibc_minor_max, 4, -1)]
    return (*tags, "manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64", "linux_x86_64")


SGLANG_0_5_17_PINS = (
    "annotated-types==0.8.0", "apache-tvm-ffi==0.1.11", "cffi==2.1.1", "compressed-tensors==0.20.1", "dill==0.4.1",
    "distro==1.9.0", "fastapi==0.165.0", "flashinfer-python==0.6.15.post1", "gguf==0.19.0", "ipython==9.18.1",
    "jiter==0.19.0", "jsonschema==4.26.0", "jsonschema-specifications==2025.9.1", "loguru==0.7.3",
    "msgspec==0.23.0", "openai==2.6.1", "opentelemetry-api==1.45.2", "orjson==3.13.0",
    "partial-json-parser==0.2.1.1.post7", "py-spy==0.4.3", "pybase64==1.5.1", "pydantic==2.14.4",
    "pydantic-core==2.50.5", "python-multipart==0.0.34", "pyzmq==27.3.0", "referencing==0.37.0",
    "rpds-py==2026.9.1", "setproctitle==1.3.8", "sgl-deep-gemm==0.1.5.post1", "sglang==0.5.17",
    "sglang-kernel==0.4.5", "sniffio==1.3.1", "soundfile==0.13.1", "starlette==1.10.0", "tokenizers==0.22.2",
    "traitlets==5.16.1", "transformers==5.12.1", "typing-extensions==4.16.0", "typing-inspection==0.4.5",
    "uvicorn==0.55.0", "xgrammar==0.2.1",
)

#: What the seat never loads with ``--attention-backend triton --sampling-backend pytorch`` on Hopper.
SGLANG_LEAN_TRIM = (
    TrimRule("sgl_kernel/flash_ops*.so", "fa3 attention (1.1 GB): the seat runs --attention-backend triton"),
    TrimRule("sgl_kernel/sm100", "Blackwell kernels: the target is Hopper (sm90)"),
    TrimRule("sgl_kernel/infllm_ops*.so", "InfLLM sparse attention: not a seat's model"),
    TrimRule("xgrammar/lib/*.a", "a static library for linking against xgrammar, never loaded"),
    TrimRule("sglang/multimodal_gen", "image and video generation: not served by a seat"),
    TrimRule("sglang/test", "SGLang's own test helpers"),
    TrimRule("sglang/srt/*/_core*.so", "the Rust gRPC, server and multimodal extensions: the seat's HTTP server "
                                       "is Python's"),
    TrimRule("deep_gemm/include", "C++ headers for deep_gemm's own JIT, not used by the seat's kernels"),
    TrimRule("flashinfer/data/cutlass", "flashinfer's JIT headers: with --sampling-backend pytorch and triton "
                                        "attention none of flashinfer's code runs (it is only imported)"),
    TrimRule("flashinfer/data/cccl", "flashinfer's JIT headers (as above)"),
)

#: Runs on the GPU host: CUDA visible, torch the image's, and SGLang's server and speculative worker importable.
SGLANG_CHECK = """
import json, sys, torch
assert torch.cuda.is_available(), "torch sees no CUDA device"
import sglang, transformers, tokenizers
from sglang.srt.server_args import ServerArgs
from sglang.srt.entrypoints.http_server import launch_server
print(json.dumps({"python": sys.version.split()[0], "torch": torch.__version__, "cuda": torch.version.cuda,
                  "device": torch.cuda.get_device_name(0), "sglang": sglang.__version__,
                  "transformers": transformers.__version__, "tokenizers": tokenizers.__version__}))
"""

TARGETS: dict[str, PackTarget] = {
    "h200-sglang-0.5.17": PackTarget(
        name="h200-sglang-0.5.17",
        description="SGLang 0.5.17 for an H200 image with Python 3.12, torch 2.11.0+cu130, nvcc 13 and no registry",
        python="3.12",
        platforms=_manylinux(39),
        pins=SGLANG_0_5_17_PINS,
        trim=SGLANG_LEAN_TRIM,
        strip_debug=("xgrammar/*.so",),
        check=SGLANG_CHECK,
        env={"PYTHONPATH": "{site}", "PATH": "{site}/bin:$PATH", "TVM_FFI_CACHE_DIR": "{site}/../tvm-ffi-cache"},
        notes=(
            "0.5.17 + sglang-kernel 0.4.5 is the newest pair built for torch 2.11.0 (0.5.23's kernel needs torch "
            "2.14's symbols)",
            "transformers 5.12.1 and tokenizers 0.22.2 shadow the image's 5.17.0 / 0.23.2, which break sglang "
            "0.5.17 at import: the package goes first on PYTHONPATH",
            "SGLang compiles a few kernels with nvcc through tvm-ffi at first use: nvcc, c++ and ninja must be on PATH",
        ),
    ),
}


#: What sgl-seat needs on the GPU host, whole, so the package also serves alone (numpy is the image's). What it shares
#: with the engine package is pinned at the same version there, so the two can stand on one path in either order.
_SHARED = ("annotated-types", "jsonschema", "jsonschema-specifications", "orjson", "py-spy", "pydantic",
           "pydantic-core", "referencing", "rpds-py", "sniffio", "typing-extensions", "typing-inspection")
SEAT_PY312_PINS = (*(p for p in SGLANG_0_5_17_PINS if p.split("==")[0] in _SHARED),
    "ray==2.60.0", "psutil==7.2.2", "pyyaml==6.0.4", "typer==0.29.2", "click==8.5.1", "shellingham==1.5.4",
    "httpx==0.29.0", "httpcore==1.0.9", "h11==0.16.0", "anyio==4.16.0", "idna==3.20", "certifi==2026.10.19.post1",
    "rich==15.0.0", "markdown-it-py==4.3.0", "mdurl==0.1.2", "pygments==2.21.0", "prometheus-client==0.26.0",
    "zstandard==0.25.0", "filelock==4.3.2", "msgpack==1.2.4", "packaging==26.4", "protobuf==7.36.2",
    "requests==2.34.2", "urllib3==2.8.0", "charset-normalizer==3.5.3", "attrs==26.1.0",
)

#: Ray's parts a seat never runs: it drives Python workers only, with the dashboard off.
SEAT_TRIM = (
    TrimRule("ray/jars", "Ray's Java workers: a seat's workers are Python"),
    TrimRule("ray/dashboard/client", "the dashboard's web front end: a seat runs Ray with the dashboard off"),
    TrimRule("ray/rllib", "a Ray library a seat never imports"),
    TrimRule("ray/serve", "a Ray library a seat never imports"),
    TrimRule("ray/data", "a Ray library a seat never imports"),
    TrimRule("ray/llm", "a Ray library a seat never imports"),
)

#: Imports sgl-seat's CLI and probe, then starts a one-CPU local Ray (loopback, no dashboard) and runs a task on it:
#: the raylet and GCS binaries the package carries run on the host.
SEAT_CHECK = """
import json, sys, time
import ray, sgl_seat, psutil, httpx, typer, zstandard
from sgl_seat.cli.main import app
from sgl_seat.probe import ring
t = time.monotonic()
ray.init(num_cpus=1, include_dashboard=False, _node_ip_address="127.0.0.1", log_to_driver=False)
answer = ray.get(ray.remote(lambda: 42).remote(), timeout=120)
ray.shutdown()
print(json.dumps({"python": sys.version.split()[0], "ray": ray.__version__, "sgl_seat": sgl_seat.__version__,
                  "psutil": psutil.__version__, "ray_task": answer, "ray_s": round(time.monotonic() - t, 1)}))
"""

TARGETS["h200-seat-py312"] = PackTarget(
    name="h200-seat-py312",
    description="sgl-seat and Ray for the same H200 image (Python 3.12), beside the engine package on the path",
    python="3.12",
    platforms=_manylinux(39),
    pins=SEAT_PY312_PINS,
    trim=SEAT_TRIM,
    check=SEAT_CHECK,
    env={"PYTHONPATH": "{site}", "PATH": "{site}/bin:$PATH"},
    notes=("what it shares with the engine package is the same version there: the two can share one PYTHONPATH",),
    from_checkout=True,
)


def target(name: str) -> PackTarget:
    from sgl_seat.errors import UsageError

    if name not in TARGETS:
        raise UsageError(f"no engine package target {name!r}", fix="one of: " + ", ".join(sorted(TARGETS)))
    return TARGETS[name]
