"""Integration modules run on two pytest-xdist workers (``--dist loadgroup``), a module never split.

Why: the integration tests wait far more than they compute (Ray and engines starting, detections, timeouts),
and one at a time they no longer fit CI's 20 minutes. Modules that draw ports from the same range, or share a
seat name's probe rings, go in one group and so run one after the other on one worker; every other module is a
group of its own. Every test here gets a group: a module's tests share module-scoped seats and clusters.
"""

from __future__ import annotations

import pytest

#: Modules that must not run beside each other (same port range or helpers); the rest: one group a module.
GROUPS = {
    "test_launch_lifecycle": "launch-ports",  # launchutil's 33000-33999 blocks, `demo` seats
    "test_launch_shared": "launch-ports",
    "test_demo": "launch-ports",
    "test_sim_engine": "sim-ports",  # simutil's 32000-32999
    "test_sim_errors": "sim-ports",
    "test_watchdog_sidecar": "sim-ports",
    "test_watchdog_sampler": "sim-ports",
    "test_gate": "sim-ports",
    "test_plan_sizing_child": "sim-ports",
    "test_watchdog_seat": "wd-ports",  # 36000-36999
    "test_watchdog_raw_prompts": "wd-ports",
}


#: Modules that run alone, after the parallel stage (scripts/test.sh): beside another module their seat's `up`,
#: a runbook's `down` and the dashboard queries timed out in a fresh-clone CI run at load ~4.
SERIAL = {"test_runbooks", "test_watchdog_seat", "test_prometheus"}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.parent.name != "integration":
            continue
        module = item.path.stem
        item.add_marker(pytest.mark.xdist_group(GROUPS.get(module, module)))
        if module in SERIAL:
            item.add_marker(pytest.mark.serial)
