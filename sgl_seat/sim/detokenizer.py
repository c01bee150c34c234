"""The detokenizer process (``sglang::detokenizer``): token ids from rank 0 -> text pieces for node 0's server.

Why a separate process: SGLang has one, sgl-seat's watchdog samples it, and a dead detokenizer must take
the seat down the same way. It keeps each request's text so a matched stop string is cut from the output,
as SGLang does, and drops the state when the request finishes.
"""

from __future__ import annotations

from typing import Any

from sgl_seat.sim import simlog
from sgl_seat.sim.step import tokens
from sgl_seat.sim.wire import Channel, ChannelClosed


def run(inp: Channel, out: Channel) -> int:
    texts: dict[str, str] = {}
    sent: dict[str, int] = {}
    log = simlog.get()
    while True:
        try:
            msg = inp.recv()
        except ChannelClosed:
            return 0
        if msg.get("t") != "out":
            continue
        items: list[dict[str, Any]] = msg.get("items", [])
        for item in items:
            rid = item["rid"]
            full = texts.get(rid, "") + tokens.decode(item["ids"])
            fin = item.get("fin")
            if fin and fin.get("type") == "stop" and isinstance(fin.get("matched"), str):
                cut = full.find(fin["matched"])
                if cut >= 0:
                    full = full[:cut]
            done = sent.get(rid, 0)
            item["text"] = full[done:]
            if fin:
                texts.pop(rid, None)
                sent.pop(rid, None)
            else:
                texts[rid] = full
                sent[rid] = len(full)
        try:
            out.send({"t": "out", "items": items})
        except ChannelClosed:
            log.error("detokenizer: the server went away")
            return 0
