"""The C writer's build and load: ``probe_native.c`` (beside this file), compiled on first use.

The C writer is the hot path's twin: the same slot writes as :mod:`.writer`'s Python wrappers (0.13 us around an
empty function against 0.9 us, and 0.4-0.9 us around the sim's real fetch against 1.4-3.1 us,
bench/watchdog_overhead.py). It is built on first use with the engine interpreter's own compiler into a private
cache (``SGLSEAT_PROBE_NATIVE_CACHE``, default ``~/.cache/sgl-seat``), once per interpreter and source, and used
wherever it builds (``SGLSEAT_PROBE_NATIVE=0``: never); :func:`.writer._native` decides, once per process.

Why a module of its own: building and loading a shared object (a compiler, a cache directory, its permissions)
is a different job from writing the ring, and it runs once per process, off the hot path.
"""

from __future__ import annotations

import contextlib
import os
import stat
import sys
from types import ModuleType

from .guard import check_private_dir

ENV_NATIVE = "SGLSEAT_PROBE_NATIVE"  # auto (default): the C writer where it builds; 0: the Python one
ENV_NATIVE_CACHE = "SGLSEAT_PROBE_NATIVE_CACHE"  # where the C writer is built (default ~/.cache/sgl-seat)


def load() -> ModuleType:
    """Build ``probe_native.c`` (once per interpreter and source) into the private cache and load it; raises where
    it cannot (no compiler, a cache that is not private)."""
    import hashlib
    import importlib.util
    import shlex
    import subprocess
    import sysconfig

    src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "probe_native.c")
    with open(src, "rb") as fh:
        code = fh.read()
    key = hashlib.sha256(code + sys.version.encode() + sys.platform.encode()).hexdigest()[:16]
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    cache = os.environ.get(ENV_NATIVE_CACHE) or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "sgl-seat")
    cache = os.path.join(cache, "probe-native")
    os.makedirs(cache, mode=0o700, exist_ok=True)
    check_private_dir(cache)  # a shared object is code: never one that someone else could have put there
    so = os.path.join(cache, f"probe_native-{sys.implementation.cache_tag}-{key}{suffix}")
    if not os.path.exists(so):
        cc = shlex.split(sysconfig.get_config_var("CC") or "cc")
        tmp = f"{so}.{os.getpid()}.tmp"
        cmd = [*cc, "-O2", "-shared", "-fPIC", "-I", sysconfig.get_paths()["include"], src, "-o", tmp]
        try:
            res = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
            if res.returncode != 0:
                raise OSError(f"{' '.join(cmd[:1])} exited {res.returncode}: {res.stderr.strip()[-300:]}")
            os.replace(tmp, so)  # atomic: ranks that build at once each put a whole file in place
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
    st = os.lstat(so)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o022:
        raise OSError(f"{so} is not a private file of uid {os.getuid()}")
    spec = importlib.util.spec_from_file_location("probe_native", so)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {so}")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod

