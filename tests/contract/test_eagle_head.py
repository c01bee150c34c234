"""The EAGLE head of ``sgl_seat/engines/eaglehead.py`` computes what the engines' EAGLE Llama computes, and is
written in the names each engine loads.

Its decoder layer is written by hand (so its training does not follow transformers' internal API from version to
version); here, in vLLM's environment (its torch and transformers), it is held to transformers' own
``LlamaDecoderLayer`` with the input norm removed, as both engines' EAGLE-1 layer is (vLLM's ``llama_eagle.py``,
SGLang's ``llama_eagle.py``), on a small random Llama config: the same weights, the same output. The written
checkpoints hold the names vLLM's ``EagleLlamaForCausalLM`` and SGLang's ``LlamaForCausalLMEagle`` load (``fc``
without a bias for vLLM, with a zero one for SGLang; no embedding or head: both engines share the target's). That
vLLM serves such a head and accepts its drafts is ``bench/vllm/eagle_acceptance.py``'s (the real engine, minutes).

Skips where the vLLM environment is absent (``bash scripts/setup.sh --engine vllm``).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.contract.conftest import CHILD_S

pytestmark = [pytest.mark.contract]

REPO = Path(__file__).resolve().parents[2]
VENV = Path(os.environ.get("SGLSEAT_VLLM_VENV") or REPO / ".venv-vllm")

_CHILD = r"""
import json, sys
from pathlib import Path
import torch
from safetensors.torch import load_file
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding
sys.path.insert(0, sys.argv[1])
import eaglehead

out_dir = Path(sys.argv[2])
torch.manual_seed(0)
cfg = {"hidden_size": 64, "intermediate_size": 160, "num_attention_heads": 4, "num_key_value_heads": 2,
       "head_dim": 16, "rms_norm_eps": 1e-5, "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
       "vocab_size": 100, "num_hidden_layers": 2, "max_position_embeddings": 256, "architectures": ["LlamaForCausalLM"],
       "tie_word_embeddings": True}
head = eaglehead._Head(cfg)
with torch.no_grad():
    head.post_norm.uniform_(0.5, 1.5)
hf = LlamaConfig(**{k: v for k, v in cfg.items() if k != "architectures"})
hf._attn_implementation = "eager"
layer = LlamaDecoderLayer(hf, layer_idx=0)
layer.input_layernorm = torch.nn.Identity()
sd = head.state_dict(fc_bias=False)
own = {k.removeprefix("layers.0."): v for k, v in sd.items() if k.startswith("layers.0.")}
layer.load_state_dict(own, strict=False)
rope = LlamaRotaryEmbedding(hf)
b, t = 2, 7
embeds, states = torch.randn(b, t, 64), torch.randn(b, t, 64)
positions = torch.arange(t)[None].expand(b, -1)
mask = torch.ones(b, t, dtype=torch.bool)
mask[1, 5:] = False  # the second row's last two positions are padding
with torch.no_grad():
    mine = head.forward(embeds, states, positions, mask)
    x = head.mods["fc"](torch.cat((embeds, states), dim=-1))
    allowed = torch.ones(t, t, dtype=torch.bool).tril()[None, None] & mask[:, None, None, :]
    additive = torch.zeros(b, 1, t, t).masked_fill(~allowed, torch.finfo(torch.float32).min)
    res = layer(x, attention_mask=additive, position_ids=positions, position_embeddings=rope(x, positions))
    theirs = res[0] if isinstance(res, tuple) else res
real = mask[:, :, None].expand_as(mine)
written = {}
for engine in eaglehead.ENGINES:
    d = eaglehead.write_for(head, {"note": "test"}, out_dir / "target", out_dir / engine, engine, "bfloat16")
    w = load_file(str(d / "model.safetensors"))
    written[engine] = {"names": sorted(w), "dtypes": sorted({str(v.dtype) for v in w.values()}),
                       "fc_bias_zero": bool((w["fc.bias"] == 0).all()) if "fc.bias" in w else None,
                       "config": json.loads((d / "config.json").read_text()),
                       "manifest": json.loads((d / eaglehead.MANIFEST).read_text())}
print("SGLSEAT_RESULT " + json.dumps({
    "max_abs_diff": float((mine - theirs)[real].abs().max()), "scale": float(theirs[real].abs().max()),
    "transformers": __import__("transformers").__version__, "written": written}))
"""


@pytest.fixture(scope="module")
def child(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    python = VENV / "bin" / "python"
    if not python.is_file():
        pytest.skip(f"the vLLM environment ({VENV}) is not set up: bash scripts/setup.sh --engine vllm")
    out = tmp_path_factory.mktemp("eagle")
    (out / "target").mkdir()
    (out / "target" / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "hidden_size": 64, "num_hidden_layers": 2, "torch_dtype": "float32",
        "tie_word_embeddings": True}))  # as SmolLM2's
    res = subprocess.run([str(python), "-c", _CHILD, str(REPO / "sgl_seat" / "engines"), str(out)],
                         capture_output=True, text=True, timeout=CHILD_S, check=False,
                         env={"PATH": os.environ.get("PATH", ""), "HOME": os.environ.get("HOME", "/root"),
                              "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith("SGLSEAT_RESULT ")]
    assert res.returncode == 0 and lines, f"exit {res.returncode}\n{res.stdout[-2000:]}\n{res.stderr[-3000:]}"
    doc: dict[str, Any] = json.loads(lines[-1].removeprefix("SGLSEAT_RESULT "))
    return doc


def test_the_heads_layer_is_transformers_llama_layer_without_its_input_norm(child: dict[str, Any]) -> None:
    # float32 on both sides: only the order of sums differs
    assert child["max_abs_diff"] <= 1e-4 * max(1.0, child["scale"]), child


def test_each_engine_gets_the_names_and_the_architecture_it_loads(child: dict[str, Any]) -> None:
    layer = ["layers.0.mlp.down_proj.weight", "layers.0.mlp.gate_proj.weight", "layers.0.mlp.up_proj.weight",
             "layers.0.post_attention_layernorm.weight", "layers.0.self_attn.k_proj.weight",
             "layers.0.self_attn.o_proj.weight", "layers.0.self_attn.q_proj.weight", "layers.0.self_attn.v_proj.weight"]
    vllm, sglang = child["written"]["vllm"], child["written"]["sglang"]
    assert vllm["names"] == sorted(["fc.weight", *layer]) and vllm["fc_bias_zero"] is None
    assert sglang["names"] == sorted(["fc.bias", "fc.weight", *layer]) and sglang["fc_bias_zero"] is True
    assert vllm["config"]["architectures"] == ["LlamaForCausalLM"]
    assert sglang["config"]["architectures"] == ["LlamaForCausalLMEagle"]
    # SGLang replaces the head's embedding and head by the target's one after the other: tied, they are one module
    # and its start fails (eaglehead.write_for); vLLM served the tied config (bench/vllm/eagle_acceptance.py)
    assert sglang["config"]["tie_word_embeddings"] is False and vllm["config"]["tie_word_embeddings"] is True
    for w in (vllm, sglang):
        assert w["dtypes"] == ["torch.bfloat16"] and w["config"]["num_hidden_layers"] == 1
        assert w["config"]["dtype"] == "bfloat16" and "torch_dtype" not in w["config"]
        assert w["manifest"]["training"] == {"note": "test"} and w["manifest"]["parameters"] > 0
