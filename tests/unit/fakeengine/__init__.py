"""A fake engine backend, all in this one module, registered as any new engine would be: the house rule's test
(``tests/unit/test_engine_plugin.py``). Its words are its own; nothing outside this module names them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from sgl_seat.core.vocabulary import EngineWords
from sgl_seat.engines import EngineBackend, register
from sgl_seat.engines.preflight import Check
from sgl_seat.errors import UsageError
from sgl_seat.spec import SeatSpec
from sgl_seat.topology import Topology

WORDS = EngineWords(
    engine="fakeeng", title_prefix="FAKE::", rank_title="FAKE::Runner", helper_titles=(("FAKE::Front", "front"),),
    metric_prefix="fake:", running="fake:running", queued="fake:waiting", generated="fake:out_tokens_total",
    progress=("fake:out_tokens_total", "fake:steps_total"), prompt_tokens="fake:in_tokens_total",
    verify_steps="fake:drafts_total", requests="fake:done_total",
)


@register
class FakeBackend(EngineBackend):
    """``python -m fakeengine.serve``: an engine sgl-seat has never heard of."""

    name: ClassVar[str] = "fakeeng"
    module: ClassVar[str] = "fakeengine.serve"
    checks: ClassVar[frozenset[Check]] = frozenset({Check.PORTS})
    health_path: ClassVar[str] = "/healthz"
    words: ClassVar[EngineWords] = WORDS
    devices: ClassVar[frozenset[str]] = frozenset({"cuda", "cpu"})

    def validate_faults(self, faults: Sequence[str], *, rehearsal: bool = False) -> tuple[str, ...]:
        if faults:
            raise UsageError("the fake engine takes no faults")
        return ()

    def argv(self, spec: SeatSpec, topo: Topology, *, node_rank: int, draft: bool, slots: int,
             mem_fraction: float) -> list[str]:
        return ["--model", spec.model.path, "--ranks", str(topo.tp), "--node", str(node_rank), "--slots", str(slots),
                *self.engine_flags(spec)]

    def engine_flags(self, spec: SeatSpec) -> list[str]:
        return ["--fake-pool", "1024"]

    def capacity_note(self, spec: SeatSpec) -> str | None:
        return "KV pool set by --fake-pool 1,024 tokens"

    def visible_gpus(self) -> list[str] | None:
        return None
