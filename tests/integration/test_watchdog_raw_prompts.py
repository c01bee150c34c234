"""A sim seat whose spec opts into ``bundles.raw_prompts``: node 0 logs requests at SGLang's level 3, and a
capture's ``requests.jsonl`` carries the prompts of /generate, /v1/completions and /v1/chat/completions (chat
text from the OpenAI payload SGLang logs first), with token counts and the shared prefix.

No Ray: the two sim nodes are process groups started by ``rigs.simrig`` with the plan's argv and
environment, the sidecars run in this process (the redacted default path is ``test_watchdog_seat.py``'s).
Ports 26750-26762 (below Linux's ephemeral range).
"""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from rigs.simrig import SimSeat, sim_spec
from sgl_seat.engines.sglang import REQUEST_LOG_LEVEL_RAW
from sgl_seat.forensics import read_bundle

pytestmark = pytest.mark.integration

HTTP = 26750
SYSTEM = "You are the on-call assistant of the inference team; keep answers short and exact. " * 4


def test_raw_prompts_opt_in_puts_the_text_in_the_bundle(tmp_path: Path) -> None:
    spec = sim_spec("wd-raw", HTTP)
    spec = spec.model_copy(update={"bundles": spec.bundles.model_copy(update={"raw_prompts": True})})
    seat = SimSeat(spec, draft=False, workdir=tmp_path / "seat")
    seat.start()
    sidecars = {}
    try:
        assert seat.plan is not None
        cmd = seat.plan.nodes[0].command
        assert cmd[cmd.index("--log-requests-level") + 1] == str(REQUEST_LOG_LEVEL_RAW)
        sidecars = seat.sidecars(tmp_path / "bundles")
        for sc in sidecars.values():
            sc.start()
        with httpx.Client(base_url=seat.url, timeout=60, trust_env=False) as c:
            r1 = c.post("/generate", json={"text": SYSTEM + "first question",
                                           "sampling_params": {"max_new_tokens": 5, "temperature": 0.2}})
            r2 = c.post("/v1/completions", json={"model": "m", "prompt": SYSTEM + "second question", "max_tokens": 6})
            r3 = c.post("/v1/chat/completions", json={"model": "m", "max_tokens": 7, "stream": True,
                                                      "messages": [{"role": "user", "content": "third question"}]})
            assert [r.status_code for r in (r1, r2, r3)] == [200, 200, 200]
        time.sleep(1.5)  # the sidecar reads the request log twice a second
        doc = sidecars[0].coordinate({"t": time.time(), "source": "manual", "node": 0})
        assert doc["status"] == "ok", doc
        b = read_bundle(Path(doc["path"]))
        assert b.manifest.redaction["prompts"] == "raw" and b.manifest.redaction["requests"] == 3
        g, cpl, chat = b.requests
        assert (g.route, g.prompt, g.max_tokens, g.sampling) == ("/generate", SYSTEM + "first question", 5,
                                                                  {"temperature": 0.2})
        assert (cpl.route, cpl.prompt, cpl.max_tokens) == ("/v1/completions", SYSTEM + "second question", 6)
        assert (chat.route, chat.prompt, chat.max_tokens, chat.stream) == (
            "/v1/chat/completions", "user: third question", 7, True)
        assert [s.output_tokens for s in b.requests] == [5, 6, 7]
        assert all(s.prompt_hash and not s.tokens_estimated and s.finished for s in b.requests)
        assert cpl.prefix_group == g.prefix_group and cpl.shared_prefix_tokens > 0  # the shared system prompt
        assert chat.prefix_group != g.prefix_group
    finally:
        for sc in sidecars.values():
            sc.stop()
        seat.stop()
