"""The KV pool and slot ceiling of a seat: SGLang 0.5.23's own sizing, or a mirror held to it.

``capacity`` (what ``plan`` asks: the pool and slots with the draft off and on, and the refusal when a seat
cannot boot), ``sglang`` (SGLang's own sizing, asked of a child process), ``child`` (that child process,
run as ``python -m sgl_seat.sizing.child``), ``mirror`` (the same arithmetic in Python, held to SGLang's code
by ``tests/contract/test_sizing_mirror.py``), ``engram`` (the Engram host table and its per-node checks),
``reconcile`` (the field report the figures are set beside), ``cache`` (SGLang's answers kept on disk).

The rest of ``sgl_seat`` imports the names below from here. They are loaded on first use: ``capacity``
imports the seat spec (pydantic), and the sizing child, which imports this package before SGLang, needs
only ``mirror``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sgl_seat.sizing.ask_sglang import (
        SGLANG_VERSION,
        SizingCase,
        SizingError,
        installed_version,
        size_with_sglang,
        sizing_session,
    )
    from sgl_seat.sizing.cache import CACHE_ENV
    from sgl_seat.sizing.capacity import (
        SOURCE_MIRROR,
        SOURCE_SGLANG,
        Capacity,
        CapacityReport,
        plan_capacity,
        refuse_if_unbootable,
        speculative_flags,
    )
    from sgl_seat.sizing.engram import (
        HostReaders,
        NodeNeeds,
        check_node,
        host_table_env,
        layout_problem,
        needs_from_env,
    )

#: Each public name and the submodule that defines it.
_HOME: dict[str, str] = {
    "CACHE_ENV": "cache",
    "SOURCE_MIRROR": "capacity", "SOURCE_SGLANG": "capacity", "Capacity": "capacity", "CapacityReport": "capacity",
    "plan_capacity": "capacity", "refuse_if_unbootable": "capacity", "speculative_flags": "capacity",
    "HostReaders": "engram", "NodeNeeds": "engram", "check_node": "engram", "host_table_env": "engram",
    "layout_problem": "engram", "needs_from_env": "engram",
    "SGLANG_VERSION": "ask_sglang", "SizingCase": "ask_sglang", "SizingError": "ask_sglang",
    "installed_version": "ask_sglang", "size_with_sglang": "ask_sglang", "sizing_session": "ask_sglang",
}

__all__ = [
    "CACHE_ENV",
    "SGLANG_VERSION",
    "SOURCE_MIRROR",
    "SOURCE_SGLANG",
    "Capacity",
    "CapacityReport",
    "HostReaders",
    "NodeNeeds",
    "SizingCase",
    "SizingError",
    "check_node",
    "host_table_env",
    "installed_version",
    "layout_problem",
    "needs_from_env",
    "plan_capacity",
    "refuse_if_unbootable",
    "size_with_sglang",
    "sizing_session",
    "speculative_flags",
]


if not TYPE_CHECKING:  # mypy reads the imports above, so a name missing from them is an error there too

    def __getattr__(name: str) -> Any:
        home = _HOME.get(name)
        if home is None:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{__name__}.{home}"), name)
        globals()[name] = value
        return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
