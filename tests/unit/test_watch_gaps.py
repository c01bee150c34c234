"""A peer whose sidecar is silent while its node agent answers (issue 24, item 3: a sidecar actor killed) is not a
lost node: :class:`~sgl_seat.watchdog.actors.RayPeers` calls it a watch gap, and only a node whose agent is silent
too is ``silent`` (and then named unreachable). Ray is a stand-in at its narrowest seam: ``ray.wait``, ``ray.get``,
``ray.get_actor`` and the two remote calls the peers make (the sidecar's ``ping``, the agent's ``__ray_ready__``);
the real actors run in tests/integration/test_watchdog_seat.py, which kills a real sidecar and a real agent.
"""

from __future__ import annotations

import json
import sys
import types
from typing import Any

import pytest

from sgl_seat.watchdog import actors
from sgl_seat.watchdog.actors import HEARTBEAT_S, SILENT_S, RayPeers
from sgl_seat.watchdog.config import SidecarConfig


class _Ref:
    def __init__(self, value: Any = None, error: Exception | None = None, done: bool = True) -> None:
        self.value, self.error, self.done = value, error, done


class _Method:
    def __init__(self, answer: Any) -> None:
        self.answer = answer  # a callable giving the next _Ref
        self.calls = 0

    def remote(self) -> _Ref:
        self.calls += 1
        ref: _Ref = self.answer()
        return ref


class _Actor:
    def __init__(self, answer: Any) -> None:
        self.ping = _Method(answer)
        self.__ray_ready__ = _Method(answer)


class _World:
    """Node 1's sidecar and agent; each answers while its flag is up, else fails as a dead actor does."""

    def __init__(self) -> None:
        self.sidecar_up = True
        self.agent_up = True
        self.sidecar = _Actor(lambda: self._answer(self.sidecar_up, json.dumps({"node": 1, "ip": "127.0.0.1"})))
        self.agent = _Actor(lambda: self._answer(self.agent_up, True))

    @staticmethod
    def _answer(up: bool, value: Any) -> _Ref:
        return _Ref(value) if up else _Ref(error=RuntimeError("ActorDiedError: the actor died unexpectedly"))

    def module(self) -> types.ModuleType:
        mod = types.ModuleType("ray")

        def wait(refs: list[_Ref], timeout: float = 0) -> tuple[list[_Ref], list[_Ref]]:
            return [r for r in refs if r.done], [r for r in refs if not r.done]

        def get(ref: _Ref, timeout: float | None = None) -> Any:
            if ref.error is not None:
                raise ref.error
            return ref.value

        def get_actor(name: str, namespace: str | None = None) -> _Actor:
            return {"s-watchdog1": self.sidecar, "agent1": self.agent}[name.replace("sgl-seat-", "")]

        mod.wait, mod.get, mod.get_actor = wait, get, get_actor  # type: ignore[attr-defined]
        return mod


@pytest.fixture()
def world(monkeypatch: pytest.MonkeyPatch) -> _World:
    w = _World()
    monkeypatch.setitem(sys.modules, "ray", w.module())
    return w


def _peers() -> RayPeers:
    cfg = SidecarConfig(seat="s", node=0, nnodes=2, thresholds={}, bundle_dir="/nonexistent", namespace="ns",
                        agents=["agent0", "agent1"])
    return RayPeers(cfg)


def _run(peers: RayPeers, t0: float, t1: float) -> dict[int, str]:
    """Tick the heartbeats every 0.1 s from ``t0`` to ``t1``; the last tick's silent nodes."""
    silent: dict[int, str] = {}
    t = t0
    while t <= t1 + 1e-9:
        silent = peers.silent(t)
        t += 0.1
    return silent


def test_a_sidecar_gone_while_its_agent_answers_is_a_watch_gap_not_a_lost_node(world: _World) -> None:
    peers = _peers()
    assert _run(peers, 100.0, 103.0) == {} and peers.watch_gaps() == {}
    assert world.agent.__ray_ready__.calls == 0  # the agent is pinged only once its sidecar is overdue
    world.sidecar_up = False
    assert _run(peers, 103.1, 110.0) == {}
    (gap,) = peers.watch_gaps().values()
    assert "its watchdog sidecar has not answered for" in gap and "ActorDiedError" in gap
    assert "its node agent answers" in gap
    assert world.agent.__ray_ready__.calls >= 5  # pinged all along, for as long as its sidecar is silent
    world.sidecar_up = True  # Ray restarted it
    assert _run(peers, 110.1, 111.0) == {} and peers.watch_gaps() == {}


def test_a_node_whose_sidecar_and_agent_are_both_silent_is_lost(world: _World) -> None:
    peers = _peers()
    _run(peers, 100.0, 103.0)
    world.sidecar_up = world.agent_up = False  # a raylet killed: both its actors die
    assert _run(peers, 103.1, 103.1 + SILENT_S - 0.2) == {}  # not yet: SILENT_S after the last answer
    pings = world.agent.__ray_ready__.calls
    silent = _run(peers, 103.1 + SILENT_S - 0.1, 108.0)
    assert list(silent) == [1] and "heartbeat answered" in silent[1]
    assert peers.watch_gaps() == {}
    # a dead agent fails at once; it is asked again every HEARTBEAT_S, not at every tick
    assert world.agent.__ray_ready__.calls - pings <= (108.0 - 103.0 - SILENT_S) / HEARTBEAT_S + 2


def test_an_agent_answer_from_before_the_sidecar_went_silent_does_not_count(world: _World) -> None:
    """A link down: the agent answered during an earlier gap, long before; that answer is no evidence now."""
    peers = _peers()
    _run(peers, 100.0, 101.0)
    world.sidecar_up = False
    _run(peers, 101.1, 106.0)
    assert peers.watch_gaps()  # a gap, the agent answering
    world.sidecar_up = True
    _run(peers, 106.1, 110.0)
    world.sidecar_up = world.agent_up = False
    silent = _run(peers, 110.1, 115.0)
    assert list(silent) == [1] and peers.watch_gaps() == {}


def test_a_peer_whose_agent_was_never_found_is_lost_as_before(world: _World, monkeypatch: pytest.MonkeyPatch) -> None:
    peers = RayPeers(SidecarConfig(seat="s", node=0, nnodes=2, thresholds={}, bundle_dir="/nonexistent",
                                   namespace="ns"))  # no agents named (a config from before): the old rule
    _run(peers, 100.0, 102.0)
    world.sidecar_up = False
    assert list(_run(peers, 102.1, 107.0)) == [1]
    assert world.agent.__ray_ready__.calls == 0
    assert actors.AGENT_AFTER_S < SILENT_S
