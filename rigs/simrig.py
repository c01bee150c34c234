"""A sim seat on 127.0.0.1 without Ray, with in-process sidecars: the watchdog bench's and tests' rig.

It starts each node of a sim plan as its own process group (as the node agent would, with the plan's
environment, so the probe loads exactly as on a real seat), drives ``/generate`` traffic from threads,
injects faults through the sim's loopback admin route, and builds :class:`Sidecar` cores wired to each
other in-process. Everything it starts it stops, by process group. Synthetic figures only.

A rig the tests and the benches share, so it lives in ``rigs/`` (not in the wheel): tests import it as
``rigs.simrig`` (pytest runs from the checkout's root); the bench scripts and ``tests/fixtures/make_bundles.py``
put the checkout on ``sys.path`` first.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from sgl_seat import envcompat
from sgl_seat.forensics.recording.loadgen import Load, posting, request_body
from sgl_seat.plan import LaunchPlan, Placeholder, build_plan
from sgl_seat.sim.front import ports as sim_ports
from sgl_seat.spec import SeatSpec, load_spec, parse_spec
from sgl_seat.watchdog.config import SidecarConfig
from sgl_seat.watchdog.peers import local_peers
from sgl_seat.watchdog.sidecar import Sidecar
from sgl_seat.watchdog.sources import ProbeReader

CHECKOUT = Path(__file__).resolve().parents[1]


def sim_spec(name: str, http_port: int, *, base: str = "local-sim",
             sections: Mapping[str, Mapping[str, Any]] | None = None, **watchdog: Any) -> SeatSpec:
    """The shipped local-sim profile renamed and moved to ``http_port`` (dist-init on ``http_port + 5``).

    ``sections`` updates whole sections' keys (``{"parallel": {"tp": 2, "ep": 1}}``: another shape).
    """
    src = load_spec(base)
    doc = yaml.safe_load(Path(src.source or "").read_text(encoding="utf-8"))
    for section, values in (sections or {}).items():
        doc.setdefault(section, {}).update(values)
    doc["name"] = name
    doc["network"]["http_port"] = http_port
    doc["network"]["dist_init_port"] = http_port + 5
    doc["model"]["config"] = str((Path(src.source or "").parent / doc["model"]["config"]).resolve())
    if watchdog:
        doc.setdefault("watchdog", {}).update(watchdog)
    return parse_spec(yaml.safe_dump(doc), path=src.source)


def wait_healthy(url: str, procs: Mapping[int, subprocess.Popen[bytes]], log_path: Callable[[int], Path], *,
                 timeout: float, what: str, poll_s: float = 0.5) -> None:
    """Until ``url``'s ``/health_generate`` answers 200. A node that exits first raises RuntimeError with its log's
    tail, and ``timeout`` passing TimeoutError with node 0's; the caller stops what it started."""
    deadline = time.monotonic() + timeout
    with httpx.Client(timeout=10.0, trust_env=False) as c:
        while True:
            for r, p in procs.items():
                if p.poll() is not None:
                    tail = log_path(r).read_text(errors="replace")[-3000:]
                    raise RuntimeError(f"{what}: node {r} exited ({p.returncode}):\n{tail}")
            with contextlib.suppress(httpx.HTTPError):
                if c.get(f"{url}/health_generate").status_code == 200:
                    return
            if time.monotonic() > deadline:
                tail = log_path(0).read_text(errors="replace")[-3000:]
                raise TimeoutError(f"{what} was not healthy within {timeout:.0f} s; node 0's log ends:\n{tail}")
            time.sleep(poll_s)


@dataclass
class SimSeat:
    spec: SeatSpec
    draft: bool
    workdir: Path
    faults: tuple[str, ...] = ()
    plan: LaunchPlan | None = None
    procs: dict[int, subprocess.Popen[bytes]] = field(default_factory=dict)

    def node_port(self, r: int) -> int:
        return sim_ports.node_port(self.spec.network.http_port, r)

    def admin_url(self, r: int) -> str:
        """Node ``r``'s loopback admin (fault) route."""
        return f"http://{sim_ports.ADMIN_HOST}:{sim_ports.admin_port(self.node_port(r))}"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.node_port(0)}"

    def log_path(self, r: int) -> Path:
        return self.workdir / f"node{r}.log"

    @property
    def request_log_dir(self) -> Path:
        """Node 0's SGLang request log (what the node agent makes ``$SGLSEAT_HOME/logs/<seat>/requests``)."""
        return self.workdir / "requests"

    def start(self, timeout: float = 180.0) -> None:
        plan = build_plan(self.spec, draft=self.draft, faults=self.faults)
        self.plan = plan.fill({Placeholder.NODE0_ADDR: "127.0.0.1", Placeholder.AGENT_PYTHON: sys.executable,
                               Placeholder.REQUEST_LOG_DIR: str(self.request_log_dir),
                               Placeholder.SEAT_FILES: str(self.workdir / "files")})
        self.workdir.mkdir(parents=True, exist_ok=True)
        for name, text in self.plan.files:  # what the node agent writes before the engine starts
            (self.workdir / "files").mkdir(exist_ok=True)
            (self.workdir / "files" / name).write_text(text, encoding="utf-8")
        self.request_log_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        for node in self.plan.nodes:
            env = {**os.environ, **node.env_dict(), "PYTHONUNBUFFERED": "1",
                   sim_ports.ENV_NODE_PORT: str(self.node_port(node.node_rank))}
            with self.log_path(node.node_rank).open("wb") as logf:
                self.procs[node.node_rank] = subprocess.Popen(
                    list(node.command), env=env, stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT,
                    start_new_session=True)
        try:
            wait_healthy(self.url, self.procs, self.log_path, timeout=timeout, what="the sim seat")
        except (RuntimeError, TimeoutError):
            self.stop()
            raise

    def stop(self) -> None:
        for p in self.procs.values():
            with contextlib.suppress(OSError):
                os.killpg(p.pid, signal.SIGTERM)
        deadline = time.monotonic() + 15
        for p in self.procs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(max(0.1, deadline - time.monotonic()))
        for p in self.procs.values():
            with contextlib.suppress(OSError):
                os.killpg(p.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(5)
        self.procs.clear()
        if self.plan is not None:
            for n in self.plan.nodes:
                d = envcompat.lookup(n.env_dict(), "SGLSEAT_PROBE_DIR")
                if d:
                    ProbeReader(d, node=n.node_rank).remove_all()

    def inject(self, fault: str, rank: int) -> float:
        """Arm ``fault`` on the node running ``rank``; returns the time it was armed."""
        assert self.plan is not None
        node = self.plan.topology.node_of(rank)
        r = httpx.post(f"{self.admin_url(node)}/sim/faults", json={"fault": fault},
                       timeout=10.0, trust_env=False)
        r.raise_for_status()
        return time.time()

    def forward_count(self, rank: int = 0) -> int:
        """The rank's forward (step) count, from the sim's admin route (answers even while the rank is stuck)."""
        assert self.plan is not None
        node = self.plan.topology.node_of(rank)
        r = httpx.get(f"{self.admin_url(node)}/sim/ranks", timeout=10.0, trust_env=False)
        r.raise_for_status()
        return int(next(x["forward_ct"] for x in r.json()["ranks"] if x["tp_rank"] == rank))

    def clear_faults(self) -> None:
        assert self.plan is not None
        for n in range(len(self.plan.nodes)):
            with contextlib.suppress(httpx.HTTPError):
                httpx.delete(f"{self.admin_url(n)}/sim/faults", timeout=10.0, trust_env=False)

    def sidecar_configs(self, bundle_dir: Path, *, metrics_port: int | None = None, recover_s: float = 10.0,
                        gpu: bool = False, **thresholds: Any) -> list[SidecarConfig]:
        assert self.plan is not None
        th = {**self.spec.watchdog.model_dump(), **thresholds}
        rank_nodes = {r.tp_rank: n.node_rank for n in self.plan.nodes for r in n.ranks}
        return [SidecarConfig(
            seat=self.spec.name, node=n.node_rank, nnodes=len(self.plan.nodes), thresholds=th,
            bundle_dir=str(bundle_dir), quota_mb=self.spec.bundles.quota_mb,
            probe_dir=envcompat.lookup(n.env_dict(), "SGLSEAT_PROBE_DIR"), log_path=str(self.log_path(n.node_rank)),
            metrics_url=f"{self.url}/metrics", metrics_port=(metrics_port + n.node_rank) if metrics_port else None,
            rank_nodes=rank_nodes, root_pid=self.procs[n.node_rank].pid, plan=self.plan.to_json(), gpu=gpu,
            recover_s=recover_s, raw_prompts=self.spec.bundles.raw_prompts,
            request_log_dir=str(self.request_log_dir) if "--log-requests-target" in n.command else None)
            for n in self.plan.nodes]

    def sidecars(self, bundle_dir: Path, **kw: Any) -> dict[int, Sidecar]:
        """One in-process sidecar per node, wired to each other (node 0 coordinates). Not started."""
        return wire(self.sidecar_configs(bundle_dir, **kw))

    def spawn_sidecars(self, bundle_dir: Path, **kw: Any) -> subprocess.Popen[bytes]:
        """The same sidecars in a separate process (as the Ray actors would be); stop it with SIGTERM."""
        cfgs = self.sidecar_configs(bundle_dir, **kw)
        path = self.workdir / f"sidecars-{time.time_ns()}.json"
        path.write_text(json.dumps([c.to_json() for c in cfgs]))
        # `python -m rigs.simrig` from any working directory: the checkout goes first on its PYTHONPATH.
        pythonpath = os.pathsep.join(p for p in (str(CHECKOUT), os.environ.get("PYTHONPATH", "")) if p)
        with (self.workdir / "sidecars.log").open("ab") as logf:
            return subprocess.Popen([sys.executable, "-m", "rigs.simrig", str(path)],
                                    env={**os.environ, "PYTHONPATH": pythonpath},
                                    stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT)


def wire(cfgs: list[SidecarConfig]) -> dict[int, Sidecar]:
    out = {c.node: Sidecar(c) for c in cfgs}
    for r, peer in local_peers(out).items():
        out[r].peers = peer
    return out


def main(argv: list[str] | None = None) -> int:
    """``python -m rigs.simrig CONFIGS.json``: run sidecars until SIGTERM / SIGINT."""
    import logging

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per /metrics poll otherwise
    args = sys.argv[1:] if argv is None else argv
    cfgs = [SidecarConfig.from_json(s) for s in json.loads(Path(args[0]).read_text())]
    scs = wire(cfgs)
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    signal.signal(signal.SIGINT, lambda *_: done.set())
    for s in scs.values():
        s.start()
    while not done.wait(0.5):  # a timeout: a signal delivered to another thread must still be seen
        pass
    for s in scs.values():
        s.stop(remove_rings=False)  # the seat goes on (the bench starts and stops sidecars against one seat)
    return 0


class Traffic(Load):
    """``concurrency`` client threads sending requests back to back until stopped (the library's load generator).

    ``/generate`` by default; ``openai=True`` sends ``/v1/completions`` (with ``sampling`` as its top-level
    fields, e.g. temperature). ``prefix_share`` of the prompts start with ``prefix`` (a shared system prompt:
    the radix cache's hits), and ``stream_share`` of the requests stream. ``ok``, ``failed`` and ``tokens`` count.
    """

    def __init__(self, url: str, *, concurrency: int = 8, max_new_tokens: int = 64, prompt_words: int = 40,
                 openai: bool = False, prefix: str = "", prefix_share: float = 0.0,
                 sampling: dict[str, Any] | None = None, stream_share: float = 0.0, seed: int = 0) -> None:
        self.url, self.openai, self.max_new_tokens, self.prompt_words = url, openai, max_new_tokens, prompt_words
        self.prefix, self.prefix_share, self.stream_share = prefix, prefix_share, stream_share
        self.sampling = dict(sampling or {})
        self._rngs = [random.Random(seed * 1000 + i) for i in range(concurrency)]  # traffic shape, not a secret
        route = "/v1/completions" if openai else "/generate"
        super().__init__(posting(url, route, self._body, tokens=True), concurrency=concurrency,
                         failures=(httpx.HTTPError, KeyError, ValueError, TypeError), pause_s=0.2, timeout=120.0,
                         name="traffic")

    def _body(self, i: int, n: int) -> dict[str, Any]:
        """Worker ``i``'s ``n``-th request (its own random stream: the same seed sends the same shapes)."""
        rng = self._rngs[i]
        words = " ".join(f"w{i}x{n}y{k}" for k in range(self.prompt_words))
        prompt = (self.prefix + words) if self.prefix and rng.random() < self.prefix_share else words
        stream = rng.random() < self.stream_share
        if not self.openai:
            return request_body("/generate", prompt, max_tokens=self.max_new_tokens, stream=stream,
                                sampling={"ignore_eos": True, **self.sampling})
        body = request_body("/v1/completions", prompt, max_tokens=self.max_new_tokens, stream=stream,
                            sampling={"ignore_eos": True, **self.sampling})
        if stream:
            body["stream_options"] = {"include_usage": True}
        return body


if __name__ == "__main__":
    sys.exit(main())
