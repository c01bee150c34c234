"""The sim held to real SGLang 0.5.23: one real two-node CPU seat and one sim seat of the same shape, same requests.

Both seats run side by side for the whole module (module-scoped fixtures): the real one is the ``local-sglang``
profile (SGLang's CPU engine, 2 nodes x 1 rank, TP2, a tiny random model), the sim one ``local-sim`` reshaped to
2 nodes x 1 "GPU", TP2. Each is started as one process group per node, straight from its filled plan, as the node
agent would (no Ray: this module runs in the integration stream ``other``). Then each test sends both the same
requests and compares what sgl-seat reads: routes and status codes and the JSON keys the code reads, the metric
names and labels the watchdog, gate and Prometheus assets use (collected from those files, so the test follows
them), process titles and the log lines sgl-seat parses, node 1's dummy health server, and the stacks of idle and
busy ranks as the project's own classifier and detectors see them.

What differs on purpose is listed in :data:`DIFFERS_ON_PURPOSE` (printed by a test, which also checks that each
entry still holds, so the list cannot go stale). Everything else that differs is a sim bug or a bug in the code
that trusted the sim.

Needs the engine's environment (``$SGLSEAT_ENGINE_VENV``, else ``.venv-sglang`` beside the venv, see
:func:`sgl_seat.engines.base.engine_venv`): without it the module skips, and under ``CI=true`` it fails. Ports:
the real seat in 24500-24549, the sim in 24550-24599 (another free block in 24500-24599 if taken). One real seat
only: each SGLang process is ~1.2 GB and CI has 2 cores.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families

from rigs.simrig import SimSeat, sim_spec, wait_healthy
from sgl_seat.core.detect import detect, one_forward
from sgl_seat.core.frames import collective_frame, short_name
from sgl_seat.core.observation import Observation
from sgl_seat.core.records import MetricsPoint, StackSample
from sgl_seat.engines import words_for
from sgl_seat.engines.base import engine_venv, parse_kv_tokens
from sgl_seat.engines.sglang import SGLangBackend
from sgl_seat.forensics.replay.analysis import classify_thread
from sgl_seat.netports import free_block
from sgl_seat.plan import LaunchPlan, Placeholder, build_plan
from sgl_seat.sim.front import ports as sim_ports
from sgl_seat.spec import WatchdogSpec, load_spec, parse_spec
from sgl_seat.watchdog.pyspy import find_pyspy, pyspy_dump
from sgl_seat.watchdog.sources import parse_metrics_text

pytestmark = [pytest.mark.integration, pytest.mark.slow]  # full tier only (README, "The tests")

WORDS = words_for("sglang")

CHECKOUT = Path(__file__).resolve().parents[2]
HOST = "127.0.0.1"
START_TIMEOUT_S = 420.0  # 40-100 s on 2 idle cores; far longer beside other test streams
REQUEST_TIMEOUT_S = 120.0
#: Port blocks (base, then the offsets a seat binds): the real seat's node 0 HTTP, dist-init and node 1's
#: dummy health server; the sim's node 0 HTTP, its admin, dist-init, node 1 and node 1's admin.
REAL_OFFSETS = (0, 5, 10)
SIM_OFFSETS = (0, sim_ports.ADMIN_PORT_OFFSET, 5, sim_ports.NODE_PORT_STEP,
               sim_ports.NODE_PORT_STEP + sim_ports.ADMIN_PORT_OFFSET)
REAL_BASES = (24500, 24515, 24530, 24565, 24580)
SIM_BASES = (24550, 24565, 24580, 24500, 24515, 24530)

#: Where sgl-seat reads engine metrics: the watchdog (its detectors in core/detect/ too), the gate, the
#: forensics over recorded metrics, and the Prometheus rules and Grafana dashboard shipped for the sidecars.
METRIC_READERS = ("sgl_seat/engines/sglang.py", "sgl_seat/watchdog/*.py", "sgl_seat/watchdog/prometheus/*.yml",
                  "sgl_seat/watchdog/grafana/*.json",
                  "sgl_seat/gate/*.py", "sgl_seat/core/*.py", "sgl_seat/core/detect/*.py", "sgl_seat/forensics/*.py")
_METRIC_NAME = re.compile(r"\bsglang:[a-z][a-z0-9_]*")  # not the titles' "sglang::"
_PROMQL = re.compile(r"""(?:expr["']?\s*:\s*)(["']?)(.+?)\1\s*,?\s*$""", re.M)
_MATCHERS = re.compile(r"(sglang:[a-z][a-z0-9_]*)\{([^}]*)\}")
_LABEL = re.compile(r"([A-Za-z_]\w*)\s*(?:=~|!~|!=|=)")
_BY = re.compile(r"\b(?:by|without)\s*\(([^)]*)\)")

#: The JSON paths sgl-seat reads from each answer ("*" : any element of a list), and who reads them.
READ_KEYS: dict[str, tuple[tuple[str, str], ...]] = {
    "GET /v1/models": (("data.0.id", "sgl_seat/forensics/recording/traffic.py"),
                       ("data.0.id", "sgl_seat/gate/arms.py")),
    "GET /server_info": (
        ("max_total_num_tokens", "sgl_seat/gate/engine_counters.py"),
        ("internal_states.0.memory_usage.token_capacity", "sgl_seat/gate/engine_counters.py"),
        ("internal_states.0.effective_max_running_requests_per_dp", "sgl_seat/gate/engine_counters.py"),
        ("version", "sgl_seat/gate/engine_counters.py"),
    ),
    "GET /get_server_info": (("max_total_num_tokens", "sgl_seat/gate/engine_counters.py"),),
    "POST /generate": (("text", "sgl_seat/forensics/recording/loadgen.py"),
                       ("meta_info.completion_tokens", "sgl_seat/forensics/recording/loadgen.py"),
                       ("meta_info.prompt_tokens", "sgl_seat/forensics/recording/recorder.py")),
    "POST /generate stream": (("meta_info.completion_tokens", "sgl_seat/forensics/recording/loadgen.py"),),
    "POST /v1/completions": (("choices.0.text", "sgl_seat/gate/client.py"),
                             ("usage.completion_tokens", "sgl_seat/forensics/recording/loadgen.py")),
    "POST /v1/completions stream": (("choices.*.text", "sgl_seat/gate/client.py"),
                                    ("usage.prompt_tokens", "sgl_seat/gate/client.py"),
                                    ("usage.completion_tokens", "sgl_seat/gate/client.py")),
    "POST /v1/chat/completions": (("choices.0.message.content", "sgl_seat/launch/demo/clients.py"),
                                  ("usage.completion_tokens", "sgl_seat/launch/demo/clients.py")),
    "POST /v1/chat/completions stream": (("choices.*.delta.content", "sgl_seat/launch/demo/clients.py"),
                                         ("usage.completion_tokens", "sgl_seat/launch/demo/clients.py")),
}
#: Paths sgl-seat reads where present (``or {}``): each must be present in both answers or in neither.
OPTIONAL_KEYS: dict[str, tuple[str, ...]] = {
    "POST /v1/completions stream": ("usage.prompt_tokens_details.cached_tokens",),
    "GET /server_info": ("max_running_requests", "speculative_algorithm"),
}

#: What differs between the sim and real SGLang's CPU seat on purpose: what -> why. Each key is
#: ``kind:subject``; :func:`_still_differs` checks every entry against the two live seats.
DIFFERS_ON_PURPOSE: dict[str, str] = {
    "metric missing on both:sglang:spec_verify_calls_total": (
        "a draft-only counter (SGLang counts verified requests only): the draft is off on both seats, since SGLang's"
        " CPU engine cannot run speculative decoding with registry packages (the gate reads it as 0 then)"),
    "metric missing on both:sglang:forward_execution_seconds_total": (
        "SGLang 0.5.23 defines it but did not export it on this seat; the detector reads it as one progress signal"
        " among several, where present (generation tokens, KV in use, decode lengths, forward passes move on both)"),
    "node1 metrics:sglang:max_total_num_tokens": (
        "node 1's /metrics: real SGLang exports its TP1 scheduler's gauges there, the sim none; sgl-seat reads only"
        " rank 0's /metrics (watchdog.config.rank0_metrics_url)"),
    "route:/sim/ranks": "the sim's loopback admin routes (fault injection, rank status); SGLang has none",
    "figure:kv pool": ("the sim's KV pool is the plan's prediction echoed (synthetic); the real one is what"
                       " --max-total-tokens gives SGLang's CPU engine"),
    "idle frame:TP0": ("the frame an idle TP0 waits in: SGLang's IdleSleeper in zmq's Poller.poll (--sleep-on-idle),"
                       " the sim in its inbox's queue wait (Scheduler._drain); both are classified alike"),
}


# --------------------------------------------------------------------------------------------------
# The engine's environment, ports, processes


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def _pick_block(bases: tuple[int, ...], offsets: tuple[int, ...], taken: set[int]) -> int:
    b = free_block(bases, offsets, avoid=taken)
    if b is None:
        raise RuntimeError(f"no free port block among {bases} (offsets {offsets}) in 24500-24599")
    taken.update(b + o for o in offsets)
    return b


def _tree(root: int) -> list[psutil.Process]:
    try:
        p = psutil.Process(root)
        return [p, *p.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def _title(p: psutil.Process) -> str:
    with contextlib.suppress(psutil.Error, IndexError):
        return str(p.cmdline()[0])
    return ""


@dataclass
class RealSeat:
    """A real SGLang CPU seat: one process group per node, started from the filled ``local-sglang`` plan."""

    plan: LaunchPlan
    workdir: Path
    procs: dict[int, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.plan.http_port}"

    def node_url(self, r: int) -> str:
        return f"http://{HOST}:{self.node_port(r)}"

    def node_port(self, r: int) -> int:
        cmd = self.command(r)
        return int(cmd[cmd.index("--port") + 1])

    def command(self, r: int) -> tuple[str, ...]:
        node = self.plan.nodes[r]
        return (SGLangBackend().colocated_argv(self.plan, r, node.command) or node.command) if r else node.command

    def log_path(self, r: int) -> Path:
        return self.workdir / f"node{r}.log"

    def launch(self) -> None:
        for node in self.plan.nodes:
            with self.log_path(node.node_rank).open("wb") as logf:
                self.procs[node.node_rank] = subprocess.Popen(
                    list(self.command(node.node_rank)), env={**os.environ, **node.env_dict()},
                    stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT, start_new_session=True)

    def wait_healthy(self, timeout: float) -> None:
        wait_healthy(self.url, self.procs, self.log_path, timeout=timeout, what="the real SGLang seat", poll_s=1.0)

    def stop(self) -> None:
        _stop_groups(self.procs, grace_s=20.0)


def _stop_groups(procs: Mapping[int, subprocess.Popen[bytes]], *, grace_s: float) -> None:
    """SIGTERM each node's process group, wait up to ``grace_s``, then SIGKILL the groups."""
    for p in procs.values():
        with contextlib.suppress(OSError):
            os.killpg(p.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for p in procs.values():
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(max(0.1, deadline - time.monotonic()))
    for p in procs.values():
        with contextlib.suppress(OSError):
            os.killpg(p.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(10)


@dataclass
class Seats:
    """The two seats under comparison, and every pid seen in their process trees."""

    real: RealSeat
    sim: SimSeat
    seen: set[int] = field(default_factory=set)

    def roots(self) -> dict[str, dict[int, int]]:
        return {"real": {r: p.pid for r, p in self.real.procs.items()},
                "sim": {r: p.pid for r, p in self.sim.procs.items()}}

    def record(self) -> None:
        for nodes in self.roots().values():
            for pid in nodes.values():
                self.seen.update(p.pid for p in _tree(pid))

    def url(self, engine: str, node: int = 0) -> str:
        return self.real.node_url(node) if engine == "real" else f"http://{HOST}:{self.sim.node_port(node)}"

    def model(self, engine: str) -> str:
        plan = self.real.plan if engine == "real" else self.sim.plan
        assert plan is not None
        cmd = plan.nodes[0].command
        return cmd[cmd.index("--served-model-name") + 1]

    def log(self, engine: str, node: int) -> str:
        path = self.real.log_path(node) if engine == "real" else self.sim.log_path(node)
        return path.read_text(errors="replace")

    def schedulers(self, engine: str) -> dict[int, psutil.Process]:
        """tp rank -> its scheduler process (by the title SGLang and the sim give it)."""
        out = {}
        for pid in self.roots()[engine].values():
            for p in _tree(pid):
                m = re.fullmatch(r"sglang::scheduler_TP(\d+)(?:_EP\d+)?", _title(p))
                if m:
                    out[int(m.group(1))] = p
        return out


def _engine_python() -> Path:
    return Path(engine_venv()) / "bin" / "python"


@pytest.fixture(scope="module")
def seats(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Seats]:
    venv = Path(engine_venv())
    if not _engine_python().is_file():
        why = (f"the real engine's environment is missing ({venv}/bin/python): bash scripts/setup.sh --engine sglang,"
               " or set SGLSEAT_ENGINE_VENV")
        if _in_ci():
            pytest.fail(f"CI=true and {why}")
        pytest.skip(why)
    work = tmp_path_factory.mktemp("sim-vs-real")
    taken: set[int] = set()
    real_base = _pick_block(REAL_BASES, REAL_OFFSETS, taken)
    sim_base = _pick_block(SIM_BASES, SIM_OFFSETS, taken)

    src = load_spec("local-sglang")
    doc = _yaml_doc(src.source)
    doc["network"].update(http_port=real_base, dist_init_port=real_base + 5)
    real_spec = parse_spec(_dump(doc), path=src.source)
    (work / "real" / "requests").mkdir(mode=0o700, parents=True)
    real = RealSeat(build_plan(real_spec).fill({
        Placeholder.ENGINE_VENV: str(venv), Placeholder.NODE0_ADDR: HOST, Placeholder.AGENT_PYTHON: sys.executable,
        Placeholder.REQUEST_LOG_DIR: str(work / "real" / "requests")}), work / "real")

    # local-sim reshaped to the real seat's shape: 2 nodes x 1 "GPU", TP2, no EP; 192 GB "GPUs" so that the
    # sim's 286 GB model still fits on two of them (figures on the sim are synthetic).
    sim = SimSeat(sim_spec("sim-vs-real", sim_base, sections={"parallel": {"tp": 2, "ep": 1},
                                                              "cluster": {"gpus_per_node": 1, "gpu_memory_gb": 192}}),
                  draft=False, workdir=work / "sim")
    s = Seats(real, sim)
    try:
        real.launch()
        s.record()
        sim.start(timeout=START_TIMEOUT_S)
        s.record()
        real.wait_healthy(START_TIMEOUT_S)
        s.record()
        yield s
    finally:
        s.record()
        real.stop()
        sim.stop()
        left = []
        for pid in s.seen:
            with contextlib.suppress(psutil.NoSuchProcess):
                p = psutil.Process(pid)
                if p.status() != psutil.STATUS_ZOMBIE:
                    p.kill()
                    left.append(pid)
        psutil.wait_procs([psutil.Process(p) for p in left if psutil.pid_exists(p)], timeout=10)
        alive = [p for p in s.seen if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
        assert not left and not alive, f"left behind after stop: {left} (killed), still alive: {alive}"


def _yaml_doc(path: str | None) -> dict[str, Any]:
    import yaml

    doc = yaml.safe_load(Path(path or "").read_text(encoding="utf-8"))
    assert isinstance(doc, dict)
    return doc


def _dump(doc: Mapping[str, Any]) -> str:
    import yaml

    return yaml.safe_dump(dict(doc))


# --------------------------------------------------------------------------------------------------
# Requests, answers, metrics, stacks


@dataclass(frozen=True)
class Answer:
    status: int
    docs: tuple[Any, ...]  # the JSON body, or each JSON event of a stream


def _requests(model: str) -> dict[str, tuple[str, str, dict[str, Any] | None]]:
    """name -> (method, path, body): what both seats are sent, in this order."""
    gen = {"text": "The capital of France is", "sampling_params": {"max_new_tokens": 8, "ignore_eos": True}}
    comp = {"model": model, "prompt": "Once upon a time", "max_tokens": 8, "ignore_eos": True}
    chat = {"model": model, "messages": [{"role": "user", "content": "Say hello"}], "max_tokens": 8}
    usage = {"stream": True, "stream_options": {"include_usage": True}}
    return {
        "GET /health": ("GET", "/health", None),
        "GET /health_generate": ("GET", "/health_generate", None),
        "GET /get_server_info": ("GET", "/get_server_info", None),
        "GET /server_info": ("GET", "/server_info", None),
        "GET /model_info": ("GET", "/model_info", None),
        "GET /v1/models": ("GET", "/v1/models", None),
        "GET /metrics": ("GET", "/metrics", None),
        "POST /generate": ("POST", "/generate", gen),
        "POST /generate stream": ("POST", "/generate", {**gen, "stream": True}),
        "POST /v1/completions": ("POST", "/v1/completions", comp),
        "POST /v1/completions stream": ("POST", "/v1/completions", {**comp, **usage}),
        "POST /v1/chat/completions": ("POST", "/v1/chat/completions", chat),
        "POST /v1/chat/completions stream": ("POST", "/v1/chat/completions", {**chat, **usage}),
        "POST /v1/completions without a prompt": ("POST", "/v1/completions", {"model": model, "max_tokens": 4}),
        "POST /v1/chat/completions without messages": ("POST", "/v1/chat/completions", {"model": model}),
        "GET /no_such_route": ("GET", "/no_such_route", None),
    }


def _exchange(c: httpx.Client, base: str, method: str, path: str, body: dict[str, Any] | None) -> Answer:
    if body is not None and body.get("stream"):
        with c.stream(method, base + path, json=body) as r:
            docs = tuple(json.loads(line[6:]) for line in r.iter_lines()
                         if line.startswith("data: ") and line != "data: [DONE]")
            return Answer(r.status_code, docs)
    r = c.request(method, base + path, json=body)
    try:
        return Answer(r.status_code, (r.json(),))
    except ValueError:
        return Answer(r.status_code, ())


def _values(doc: Any, path: str) -> list[Any]:
    """The values at ``path`` (dotted; a number indexes a list, ``*`` is every element), None counted absent."""
    cur = [doc]
    for part in path.split("."):
        nxt: list[Any] = []
        for c in cur:
            if isinstance(c, list) and part == "*":
                nxt += c
            elif isinstance(c, list) and part.isdigit() and int(part) < len(c):
                nxt.append(c[int(part)])
            elif isinstance(c, dict) and c.get(part) is not None:
                nxt.append(c[part])
        cur = nxt
    return cur


def _has(ans: Answer, path: str) -> bool:
    return any(_values(d, path) for d in ans.docs)


@pytest.fixture(scope="module")
def answers(seats: Seats) -> dict[str, dict[str, Answer]]:
    """engine -> request name -> answer, each request sent to both seats (also the traffic the metrics need)."""
    out: dict[str, dict[str, Answer]] = {}
    with httpx.Client(timeout=REQUEST_TIMEOUT_S, trust_env=False) as c:
        for engine in ("real", "sim"):
            base = seats.url(engine)
            out[engine] = {name: _exchange(c, base, *req) for name, req in _requests(seats.model(engine)).items()}
    seats.record()
    return out


def _scrape(url: str) -> dict[str, set[str]]:
    """Every metric on ``url``'s /metrics (family and sample names) -> the label names its samples carry."""
    text = httpx.get(f"{url}/metrics", timeout=30.0, trust_env=False).text
    out: dict[str, set[str]] = {}
    for fam in text_string_to_metric_families(text):
        out.setdefault(fam.name, set())
        for s in fam.samples:
            labels = set(s.labels) - {"le", "quantile"}
            out.setdefault(s.name, set()).update(labels)
            out[fam.name].update(labels)
    return out


def used_metrics() -> tuple[set[str], dict[str, set[str]]]:
    """The engine metric names sgl-seat reads (by regex over :data:`METRIC_READERS`), and the labels its PromQL
    names on them (``name{label=...}`` matchers, ``by (label)`` on a line that reads one)."""
    names: set[str] = set()
    labels: dict[str, set[str]] = {}
    for pattern in METRIC_READERS:
        for path in sorted(glob.glob(str(CHECKOUT / pattern))):
            for line in Path(path).read_text(encoding="utf-8").splitlines():
                here = set(_METRIC_NAME.findall(line))
                names |= here
                for m in _MATCHERS.finditer(line):
                    labels.setdefault(m.group(1), set()).update(_LABEL.findall(m.group(2)))
                for m in _BY.finditer(line):
                    for name in here:
                        labels.setdefault(name, set()).update(x.strip() for x in m.group(1).split(",") if x.strip())
    return names, labels


@pytest.fixture(scope="module")
def metrics(seats: Seats, answers: dict[str, dict[str, Answer]]) -> dict[str, dict[str, set[str]]]:
    """engine -> node 0's /metrics after the requests above."""
    return {engine: _scrape(seats.url(engine)) for engine in ("real", "sim")}


def _point(url: str, t: float) -> MetricsPoint:
    """Node 0's /metrics as the watchdog records it (``sglang:*`` summed over labels), through its own parser."""
    return MetricsPoint(t=t, node=0, values=parse_metrics_text(
        httpx.get(f"{url}/metrics", timeout=30.0, trust_env=False).text, WORDS.metric_prefix))


def _samples(seats: Seats, engine: str, n: int, gap_s: float) -> list[StackSample]:
    """``n`` py-spy dumps of every scheduler of ``engine``, ``gap_s`` apart, through the watchdog's own dumper."""
    exe = find_pyspy()
    assert exe, "py-spy is not installed beside this interpreter nor on PATH"
    scheds = seats.schedulers(engine)
    assert scheds, f"{engine}: no scheduler process found"
    out = []
    for i in range(n):
        if i:
            time.sleep(gap_s)
        for rank, p in sorted(scheds.items()):
            # A --nonblocking dump reads a running process's stack while it moves: now and then it fails (py-spy
            # prints its own backtrace); the sampler keeps such a sample as an error, here it is taken again.
            for _ in range(5):
                res = pyspy_dump(p.pid, exe=exe, timeout_s=20.0)
                if res.error is None:
                    break
            assert res.error is None, f"{engine} TP{rank}: py-spy failed 5 times: {res.error}"
            out.append(StackSample(t=time.time(), node=rank, pid=p.pid, title=_title(p), rank=rank, native=False,
                                   threads=res.threads))
    return out


def _state(s: StackSample) -> str:
    st = classify_thread(s.main_thread())
    return f"{st.state} at {st.frame}"


@dataclass
class _LongRequest:
    """A streamed /generate of many tokens in a thread, closed by :meth:`stop` (the engine aborts it)."""

    url: str
    started: threading.Event = field(default_factory=threading.Event)
    done: threading.Event = field(default_factory=threading.Event)
    error: list[str] = field(default_factory=list)

    def run(self) -> None:
        body = {"text": "Tell me a long story", "stream": True,
                "sampling_params": {"max_new_tokens": 3000, "ignore_eos": True}}
        try:
            with httpx.Client(timeout=REQUEST_TIMEOUT_S, trust_env=False) as c, c.stream(
                    "POST", f"{self.url}/generate", json=body) as r:
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        self.started.set()
                    if self.done.is_set():
                        return
        except httpx.HTTPError as exc:
            self.error.append(repr(exc))
        finally:
            self.started.set()


@contextlib.contextmanager
def _busy(url: str) -> Iterator[_LongRequest]:
    req = _LongRequest(url)
    t = threading.Thread(target=req.run, name="long-request", daemon=True)
    t.start()
    try:
        assert req.started.wait(REQUEST_TIMEOUT_S), "the long request never streamed a token"
        assert not req.error, req.error
        # SGLang refreshes its running-requests gauge with its decode log (every 40 decode steps): seconds after
        # the first token on the trained model's slower steps. Sampled before that, a running seat reads 0.
        deadline = time.monotonic() + 60.0
        while _point(url, 0.0).values.get(WORDS.running, 0.0) < 1 and time.monotonic() < deadline:
            time.sleep(0.5)
        yield req
    finally:
        req.done.set()
        t.join(REQUEST_TIMEOUT_S)


def _wait_idle(url: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while _point(url, 0.0).values.get(WORDS.running, 0.0) > 0:
        assert time.monotonic() < deadline, f"{url}: requests still running after {timeout:.0f} s"
        time.sleep(0.5)


# --------------------------------------------------------------------------------------------------
# The comparisons


def test_routes_answer_both_seats_with_the_same_status_and_the_keys_sgl_seat_reads(
        answers: dict[str, dict[str, Answer]]) -> None:
    """GIVEN the same requests sent to node 0 of the real seat and of the sim (every route sgl-seat calls, streamed
    and not, and malformed ones)
    WHEN their answers are compared
    THEN each status code is the same, every JSON path sgl-seat reads is in both answers, and each path it reads
    only where present is in both or in neither."""
    real, sim = answers["real"], answers["sim"]
    codes = {name: (real[name].status, sim[name].status) for name in real}
    assert all(a == b for a, b in codes.values()), {k: v for k, v in codes.items() if v[0] != v[1]}
    assert all(real[name].status == 200 for name in READ_KEYS), codes
    missing = [f"{engine} {name}: {path} (read by {who})" for name, keys in READ_KEYS.items()
               for path, who in keys for engine in ("real", "sim") if not _has(answers[engine][name], path)]
    assert not missing, missing
    optional = {f"{name}: {path}": (_has(real[name], path), _has(sim[name], path))
                for name, paths in OPTIONAL_KEYS.items() for path in paths}
    assert all(a == b for a, b in optional.values()), {k: v for k, v in optional.items() if v[0] != v[1]}


def test_read_keys_name_code_that_still_reads_them() -> None:
    """GIVEN the JSON paths this module checks, each with the file that reads it
    WHEN the files are read
    THEN each still spells the path's last key (a key nobody reads any more must leave the list)."""
    stale = [f"{who}: {path}" for keys in READ_KEYS.values() for path, who in keys
             if f'"{path.rsplit(".", 1)[-1]}"' not in (CHECKOUT / who).read_text(encoding="utf-8")]
    assert not stale, stale


def test_metrics_sgl_seat_reads_are_on_both_seats_with_the_same_labels(
        metrics: dict[str, dict[str, set[str]]]) -> None:
    """GIVEN node 0's /metrics of both seats after traffic, and every engine metric name (and PromQL label) that the
    watchdog, detectors, gate, forensics and the Prometheus/Grafana assets read, collected from those files
    WHEN each name is looked up on both
    THEN it is on both with the same label names (less what DIFFERS_ON_PURPOSE lists: draft-only metrics on a
    draft-off seat), and every label the assets name is on it."""
    names, labels = used_metrics()
    assert WORDS.running in names and set(WORDS.progress) <= names, "the regex no longer finds the detector's metrics"
    real, sim = metrics["real"], metrics["sim"]
    on_purpose = {k.split(":", 1)[1] for k in DIFFERS_ON_PURPOSE if k.startswith("metric ")}
    problems = []
    for name in sorted(names - on_purpose):
        if name not in real or name not in sim:
            problems.append(f"{name}: real {'has' if name in real else 'lacks'} it, "
                            f"sim {'has' if name in sim else 'lacks'} it")
        elif real[name] != sim[name]:
            problems.append(f"{name}: labels real {sorted(real[name])} vs sim {sorted(sim[name])}")
        for lab in sorted(labels.get(name, set())):
            if (name in real and lab not in real[name]) or (name in sim and lab not in sim[name]):
                problems.append(f"{name}: label {lab} (named by sgl-seat's PromQL) missing")
    assert not problems, "\n".join(problems)


def test_process_titles_are_sglangs_on_both_seats(seats: Seats) -> None:
    """GIVEN both seats up
    WHEN the ``sglang::`` titles (psutil cmdline[0]) of each node's process tree are read
    THEN node 0 runs sglang::scheduler_TP0 and sglang::detokenizer, node 1 sglang::scheduler_TP1 only, on both."""
    assert seats.real.plan is not None and seats.sim.plan is not None
    want = {r: {ri.process_title for ri in n.ranks} | ({"sglang::detokenizer"} if r == 0 else set())
            for r, n in enumerate(seats.real.plan.nodes)}
    assert want == {0: {"sglang::scheduler_TP0", "sglang::detokenizer"}, 1: {"sglang::scheduler_TP1"}}
    for engine, roots in seats.roots().items():
        got = {r: {t for t in map(_title, _tree(pid)) if t.startswith("sglang::")} for r, pid in roots.items()}
        assert got == want, f"{engine}: {got}"


def test_log_lines_sgl_seat_parses_are_in_both_seats_logs(seats: Seats) -> None:
    """GIVEN both seats' node logs after start-up and traffic
    WHEN sgl-seat's own log parsers read them (the KV pool line, the rank prefix of scheduler lines)
    THEN node 0's log gives a KV pool size on both, and each node's scheduler lines carry its rank's prefix."""
    from sgl_seat.core.detect.exited import _LINE_TP

    for engine in ("real", "sim"):
        kv = parse_kv_tokens(seats.log(engine, 0))
        assert kv is not None and kv > 0, f"{engine}: no 'KV Cache is allocated ... #tokens: N' line on node 0"
        for node in (0, 1):
            ranks = {int(m.group(1)) for line in seats.log(engine, node).splitlines() if (m := _LINE_TP.match(line))}
            assert ranks == {node}, f"{engine} node {node}: scheduler lines name ranks {ranks}"


def test_node1_serves_sglangs_dummy_health_server_on_both_seats(seats: Seats) -> None:
    """GIVEN node 1 of each seat (rank >= 1 serves only SGLang's dummy health server)
    WHEN its health and API routes are asked
    THEN /health and /health_generate answer 200 on both, and every other route the same status on both."""
    codes = {}
    with httpx.Client(timeout=30.0, trust_env=False) as c:
        for path in ("/health", "/health_generate", "/ping", "/get_server_info", "/v1/models", "/metrics"):
            codes[path] = tuple(c.get(seats.url(engine, 1) + path).status_code for engine in ("real", "sim"))
    assert codes["/health"] == codes["/health_generate"] == (200, 200), codes
    assert all(a == b for a, b in codes.values()), codes


def test_idle_ranks_are_neither_busy_nor_hung_to_the_detectors(seats: Seats) -> None:
    """GIVEN both seats idle (no request running), each scheduler dumped by py-spy as the sampler does, as many
    times and as far apart as the stack detector needs, and node 0's /metrics beside each round
    WHEN the project's classifier and detectors read them
    THEN on both engines TP1 waits in the request broadcast, TP0 waits for requests (classified alike on both), no
    rank is in one long forward, and detect() gives no verdict."""
    th = WatchdogSpec()
    states: dict[str, dict[int, set[str]]] = {}
    for engine in ("real", "sim"):
        url = seats.url(engine)
        _wait_idle(url)
        samples = _samples(seats, engine, th.stack_unchanged_samples, 1.0 / th.sample_hz)
        pts = [_point(url, s.t) for s in samples if s.rank == 0]
        obs = Observation.of(words=WORDS, samples=samples, metrics=pts, rank_nodes={0: 0, 1: 1})
        now = max(s.t for s in samples)
        states[engine] = {r: {_state(s) for s in samples if s.rank == r} for r in (0, 1)}
        print(f"{engine} idle: {states[engine]}")
        assert one_forward(obs, th, now) is None, f"{engine}: idle ranks taken for one long forward"
        assert detect(obs, th, now) is None, f"{engine}: a verdict on an idle seat: {detect(obs, th, now)}"
        for s in samples:
            st = classify_thread(s.main_thread())
            if s.rank == 1:
                # TP1 waits in the request broadcast; a sample can catch it between two (its loop's Python, before
                # the next one) while TP0 is slow to send on a loaded box (the CI run of 2026-12-06 18:37 did: real
                # TP1 running at torch's RuntimeContext.config_bag), never idle and never in a forward.
                frame = collective_frame(s.main_thread())
                assert st.state in ("collective", "running"), f"{engine} idle TP1: {_state(s)}"
                assert st.state == "running" or (frame is not None and short_name(frame) == "broadcast"), \
                    f"{engine} idle TP1: {_state(s)}"
            else:
                # TP0 sends each loop's (empty) request list to TP1: on a loaded 2-core box a sample can catch it in
                # that collective while TP1 is slow to take it (the CI runs of 2026-12-06 15:00 and 15:30 did: real
                # SGLang in broadcast, the sim in Channel.send)
                assert st.state in ("idle", "running", "collective"), f"{engine} idle TP0 classified {_state(s)}"
        assert states[engine][0] - {x for x in states[engine][0] if x.startswith("collective")}, \
            f"{engine} idle TP0 never seen waiting for requests: {states[engine][0]}"
        assert any(x.startswith("collective") for x in states[engine][1]), \
            f"{engine} idle TP1 never seen in the request broadcast: {states[engine][1]}"
    # The same state for each idle rank on both engines (the frames differ: see DIFFERS_ON_PURPOSE); TP0's moments in
    # the request broadcast, and TP1's between two, are luck, not a state of the engine.
    kinds = {e: {r: {x.split(" at ", 1)[0] for x in v
                     if not (r == 0 and x.startswith("collective")) and not (r == 1 and x.startswith("running"))}
                 for r, v in by_rank.items()} for e, by_rank in states.items()}
    assert kinds["real"] == kinds["sim"], kinds


def test_busy_ranks_are_running_and_not_hung_to_the_detectors(seats: Seats) -> None:
    """GIVEN one long streamed generation running on each seat, each scheduler dumped by py-spy while it runs, and
    node 0's /metrics beside each round
    WHEN the project's classifier and detectors read them
    THEN every busy rank's sample is at work (in its forward or step) or in a collective, never idle; some rank is
    seen in its forward at least once; and detect() gives no verdict while tokens progress.

    Which rank is caught in its forward is the scheduler's choice: with two ranks on two shared cores the faster one
    waits in all_reduce for the other, and the landing CI of 78ea7e0 saw TP0 there in five samples of five while TP1
    was in UnquantizedLinearMethod.apply. So the forward is asked of the seat, not of TP0."""
    th = WatchdogSpec()
    for engine in ("real", "sim"):
        url = seats.url(engine)
        with _busy(url):
            samples = _samples(seats, engine, th.stack_unchanged_samples, 1.0 / th.sample_hz)
            pts = [_point(url, s.t) for s in samples if s.rank == 0]
        seats.record()
        obs = Observation.of(words=WORDS, samples=samples, metrics=pts, rank_nodes={0: 0, 1: 1})
        now = max(s.t for s in samples)
        states = {r: [_state(s) for s in samples if s.rank == r] for r in (0, 1)}
        print(f"{engine} busy: {states}")
        assert all(p.values.get(WORDS.running, 0.0) >= 1 for p in pts), f"{engine}: the long request was not running"
        kinds = [classify_thread(s.main_thread()).state for s in samples]
        # at work: in its forward or step, the sim's host row fetch inside it (a loaded box's sample caught TP0 in
        # fetch_rows, the CI run of 2026-12-06 15:30), or a collective
        assert set(kinds) <= {"running", "rowfetch", "collective"}, states
        assert "running" in kinds, states
        assert detect(obs, th, now) is None, f"{engine}: a verdict on a busy seat: {detect(obs, th, now)}"
        _wait_idle(url)


def test_what_differs_on_purpose_still_differs(seats: Seats, metrics: dict[str, dict[str, set[str]]]) -> None:
    """GIVEN the list of differences between the sim and the real seat kept on purpose
    WHEN each is checked against the two live seats
    THEN each still holds (an entry that no longer differs must leave the list), and the list is printed."""
    for what, why in DIFFERS_ON_PURPOSE.items():
        print(f"differs on purpose: {what}: {why}")
    stale = [what for what in DIFFERS_ON_PURPOSE if not _still_differs(what, seats, metrics)]
    assert not stale, stale


def _still_differs(what: str, seats: Seats, metrics: Mapping[str, Mapping[str, set[str]]]) -> bool:
    kind, _, subject = what.partition(":")
    if kind == "metric missing on both":  # read by sgl-seat, absent from both seats (the draft is off on both)
        return subject in used_metrics()[0] and subject not in metrics["real"] and subject not in metrics["sim"]
    if kind == "metric":
        return subject in used_metrics()[0] and (subject in metrics["real"]) != (subject in metrics["sim"])
    check = _CHECKS.get(kind)
    assert check is not None, f"DIFFERS_ON_PURPOSE: unknown kind {kind!r} in {what!r}"
    return check(seats, subject)


def _sim_only_route(seats: Seats, route: str) -> bool:
    with httpx.Client(timeout=30.0, trust_env=False) as c:
        sim = c.get(f"{seats.sim.admin_url(0)}{route}").status_code
        real = c.get(seats.url("real") + route).status_code
    return sim == 200 and real == 404


def _kv_differs(seats: Seats, _subject: str) -> bool:
    return parse_kv_tokens(seats.log("real", 0)) != parse_kv_tokens(seats.log("sim", 0))


def _node1_metric(seats: Seats, name: str) -> bool:
    return name in _scrape(seats.url("real", 1)) and name not in _scrape(seats.url("sim", 1))


def _idle_frames_differ(seats: Seats, _subject: str) -> bool:
    frames = {}
    for engine in ("real", "sim"):
        _wait_idle(seats.url(engine))
        # The gauge reads 0 once the requests are gone; the scheduler can still be ending its last step (an aborted
        # long request's forward is ~0.1 s a token on the trained model, 2 cores shared): sample until it waits.
        deadline = time.monotonic() + 30.0
        while True:
            frames[engine] = classify_thread(_samples(seats, engine, 1, 0.0)[0].main_thread())
            if frames[engine].state == "idle" or time.monotonic() > deadline:
                break
            time.sleep(0.5)
    return frames["real"].frame != frames["sim"].frame and frames["real"].state == frames["sim"].state


_CHECKS: dict[str, Callable[[Seats, str], bool]] = {
    "route": _sim_only_route, "figure": _kv_differs, "node1 metrics": _node1_metric, "idle frame": _idle_frames_differ}
