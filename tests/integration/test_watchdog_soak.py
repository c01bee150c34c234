"""The watchdog soak, CI size: the same code as ``bench/watchdog_soak.py`` (``rigs/soak.py``) on a smaller sample.

Why: a watchdog that fires in seconds must show that it does not fire on healthy work and that it catches each
fault kind fast. One two-node sim seat (draft off; the bench also runs draft on) at the default thresholds:
a 400,000-token prefill that is one forward of >= 30 s on every rank (synthetic prefill cost), the other healthy
episodes as the time allows (idle gaps, bursts past the slot cap, a rank 5x slower but alive), then two CPU-side
row-fetch stalls at random steps and gather sizes, one slow-then-stall and one crash, each followed by
recovery. Asserted (issue 15): no false bundle, every fault fired and got one bundle of the right kind naming
its rank (no miss, no wrong rank), and per kind p95 <= 3 s from the fault passing its detector's
threshold to the bundle on disk.
Ports 30860-30876 (the bench's own run uses 30800-30856). About 2.5 minutes (150 s measured on 2 cores at load
4-5); everything it starts it stops (checked by pid).
"""

from __future__ import annotations

from pathlib import Path

import psutil
import pytest

from rigs import soak

# Full tier only (README, "The tests"): soak-length; its long form is bench/watchdog_soak.py.
pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_soak_no_false_bundles_and_fast_detection(tmp_path: Path) -> None:
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    # Its own ports and seat name (soak-off-30860): the bench's 30-minute run on 30800 can run beside it.
    rep = soak.run_soak(minutes=2.0, faults={"stall": 2, "slow-stall": 1, "crash": 1}, seed=15, workdir=tmp_path,
                        base_port=30860, drafts=(False,), healthy_first=("prefill",), log=print)
    print(soak.table(rep))

    # The sample is real: the long prefill ran (>= 30 s to its answer), and healthy time was watched.
    assert rep.prefill_forward_s and min(rep.prefill_forward_s) >= 30.0, rep.prefill_forward_s
    assert rep.healthy_s >= 45.0
    assert rep.probe_read_errors == 0
    # Healthy work: no bundle at all.
    assert rep.false_bundles == [], rep.false_bundles
    # Every fault fired and got its bundle (no miss), of the right kind, naming the faulted rank; one bundle per
    # fault. A stall's rank comes from the probe; a crash's from its peers' collective errors, which name the dead
    # peer by a socket of its (polls alone could not order a SIGKILL cascade across nodes: the 30-minute soak of
    # 30 Nov named the wrong rank in 5 of 20 crashes before the sampler kept the schedulers' ports).
    outcomes = [(f.kind, f.spec, f.outcome, f.verdict, f.verdict_rank) for f in rep.faults]
    assert len(rep.faults) == 4 and all(f.outcome == "caught" for f in rep.faults), outcomes
    assert all(f.verdict == soak.EXPECTED[f.kind].value for f in rep.faults), outcomes
    assert all(f.verdict_rank == f.rank for f in rep.faults), outcomes
    assert sum(f.extra_bundles for f in rep.faults) == 0
    # Fault past its detector's threshold -> bundle on disk: p95 <= 3 s per kind.
    th = rep.thresholds["rowfetch_inflight_s"]
    for kind in soak.FAULT_KINDS:
        late = [f.latency() - (th if kind != "crash" else 0.0) for f in rep.faults if f.kind == kind]
        assert late and soak.percentile(late, 95) <= 3.0, (kind, late)

    left = [p for p in psutil.Process().children(recursive=True)
            if p.pid not in before and p.status() != psutil.STATUS_ZOMBIE]
    assert not left, left
