"""``python -m sgl_seat.sim.launch_server <SGLang flags>``: one node of a sim seat.

Order of a launch, and why:

1. parse the flags and the environment (bad input: one clear line, exit 2, no traceback);
2. bind this node's sockets *before* starting anything (a port in use fails in milliseconds, clearly);
   the listen port is ``--port`` (``SGLSEAT_SIM_NODE_PORT`` overrides it where several simulated nodes share
   one host) and the admin port is that + 2 on 127.0.0.1 only;
3. start the children (schedulers for the local TP ranks; on node 0 also the detokenizer) and wait until
   every one is ready, which includes the cross-node rendezvous, bounded by ``--dist-timeout``;
4. serve: node 0 SGLang's API, nodes >= 1 a dummy health server; both the admin routes.

The main process imports neither torch nor the scheduler: only its children do.
"""

from __future__ import annotations

import asyncio
import dataclasses
import socket
import sys
from collections.abc import Sequence

from sgl_seat.errors import UsageError
from sgl_seat.netports import any_free_port
from sgl_seat.sim import args, simlog
from sgl_seat.sim.front import ports


class PortInUse(Exception):
    pass


def bind(host: str, port: int, what: str) -> socket.socket:
    """Bind (not listen yet: clients are refused, not left hanging, until the node is ready)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise PortInUse(f"cannot bind the {what} to {host}:{port}: {e.strerror or e}") from None
    sock.set_inheritable(False)
    return sock


async def _serve(cfg: args.SimConfig, node: object, http_sock: socket.socket, admin_sock: socket.socket) -> int:
    from sgl_seat.sim.front.admin import build_admin_app
    from sgl_seat.sim.node import NodeRuntime, make_server

    assert isinstance(node, NodeRuntime)
    node.start_threads(asyncio.get_running_loop())
    admin = make_server(build_admin_app(node))
    warmup: asyncio.Task[None] | None = None
    if cfg.node_rank == 0:
        from sgl_seat.sim.front.frontend import Frontend
        from sgl_seat.sim.front.metrics import SimMetrics
        from sgl_seat.sim.front.server import build_main_app

        metrics = SimMetrics(model_name=cfg.served_model_name, spec_on=cfg.spec_on) if cfg.enable_metrics else None
        fe = Frontend(cfg, node, metrics)
        main = make_server(build_main_app(fe, cfg))
        warmup = asyncio.create_task(fe.warmup())
    else:
        from sgl_seat.sim.front.server import build_dummy_app

        main = make_server(build_dummy_app(cfg))
    node.servers = [main, admin]
    node.log.info(f"serving on http://{cfg.host}:{cfg.node_port} (admin on http://{ports.ADMIN_HOST}:{cfg.admin_port})")
    await asyncio.gather(main.serve(sockets=[http_sock]), admin.serve(sockets=[admin_sock]))
    if warmup is not None and not warmup.done():
        warmup.cancel()
    return node.finish_stop()


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        cfg = args.parse(argv)
    except UsageError as e:
        print(f"usage: {args.PROG} [flags as for sglang.launch_server]", file=sys.stderr)
        print(f"{args.PROG}: error: {e}", file=sys.stderr)
        return 2
    log = simlog.configure("", cfg.log_level)
    log.info(simlog.SYNTHETIC_NOTE)
    if cfg.dist_init_addr is None:
        cfg = dataclasses.replace(cfg, dist_init_addr=f"127.0.0.1:{any_free_port()}")
    try:
        http_sock = bind(cfg.host, cfg.node_port, "HTTP server" if cfg.node_rank == 0 else "health server")
        admin_sock = bind(ports.ADMIN_HOST, cfg.admin_port, "sim admin server")
    except PortInUse as e:
        log.error(f"{e}; the port is in use: pick a free --port (the admin port is --port + "
                  f"{ports.ADMIN_PORT_OFFSET}) or stop what holds it")
        return 1

    from sgl_seat.sim.node import LaunchError, NodeRuntime

    node = NodeRuntime(cfg)
    node.install_signals()
    node.spawn_children()
    try:
        node.wait_ready()
    except LaunchError as e:
        return node.fail_launch(str(e))
    return asyncio.run(_serve(cfg, node, http_sock, admin_sock))


if __name__ == "__main__":
    sys.exit(main())
