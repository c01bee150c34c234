"""Entry point of the sim's child processes: ``python -m sgl_seat.sim.worker {scheduler|detokenizer} JSON``.

Order matters and mirrors SGLang: first ``PR_SET_PDEATHSIG`` (never outlive the node's main process), then
the process title (so ``ps``/psutil/py-spy see ``sglang::...`` from the earliest moment), then logging, and
only then the heavy imports (torch, for schedulers).
"""

from __future__ import annotations

import faulthandler
import json
import sys


def main(argv: list[str]) -> int:
    role, payload = argv[0], json.loads(argv[1])
    from sgl_seat.sim.proctree import die_with_parent

    die_with_parent(int(payload["parent"]))
    import setproctitle

    setproctitle.setproctitle(payload["name"])
    faulthandler.enable()

    from sgl_seat.sim import contract, simlog
    from sgl_seat.sim.args import SimConfig
    from sgl_seat.sim.wire import Channel

    cfg = SimConfig.from_json(payload["config"])
    fds: dict[str, int] = payload["fds"]
    if role == "scheduler":
        tp_rank = int(cfg.extra["tp_rank"])
        ep_rank = cfg.ep_rank_of(tp_rank)
        simlog.configure(contract.scheduler_prefix(tp_rank, ep_rank, cfg.tp_size, cfg.ep_size), cfg.log_level)
        from sgl_seat.sim import scheduler

        out = Channel.from_fd(fds["out"]) if "out" in fds else None
        return scheduler.run(cfg, tp_rank, Channel.from_fd(fds["ctl"]), out, int(payload["parent"]))
    if role == "detokenizer":
        simlog.configure("", cfg.log_level)
        from sgl_seat.sim import detokenizer

        return detokenizer.run(Channel.from_fd(fds["in"]), Channel.from_fd(fds["out"]))
    print(f"sgl_seat.sim.worker: unknown role {role!r}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
