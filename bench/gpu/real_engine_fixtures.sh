#!/usr/bin/env bash
# Real SGLang 0.5.17 on one H200, draft off and draft on (STANDALONE, the draft = the target), from the offline
# engine package (`sgl-seat engine pack --target h200-sglang-0.5.17 --out .carry/pkg`): what the CI's GPU fixtures
# are recorded from. The model is RANDOM WEIGHTS (`--load-format dummy`), a tiny Llama made by
# sgl_seat/engines/tinymodel.py and widened to hidden 512, 2 layers, 4 heads x head_dim 128, 2 KV heads: the client
# and the scheduler set the pace, not the GPU. EAGLE's head is the same config with one layer and
# LlamaForCausalLMEagle, random too. Per arm it keeps: the server log, /get_server_info, /metrics after 8 requests
# (4 streamed), a py-spy dump of the scheduler, and the answers. Usage on the GPU host, from the checkout:
#   bash bench/gpu/real_engine_fixtures.sh PKG_DIR OUT_DIR [PYTHON] [ARM ...]   (arms: off standalone eagle)
set -u
PKG=${1:?package dir}; OUT=${2:?out dir}; PY=${3:-/opt/torch/.venv/bin/python3}; shift 3 2>/dev/null || shift $#
ARMS=${*:-off standalone}
ENG=/tmp/sgl-seat-eng; M=/tmp/sgl-seat-tiny-llama; PORT=30123
mkdir -p "$OUT"
[ -f $ENG/env.sh ] || "$PY" "$PKG/hostlayout.py" "$PKG" $ENG --python "$PY" --no-check --json > "$OUT/hostlayout.json"
. $ENG/env.sh
if [ ! -f $M/config.json ]; then
  "$PY" sgl_seat/engines/tinymodel.py $M --arch llama > "$OUT/tinymodel.txt" 2>&1
  "$PY" - "$M/config.json" <<'PYEOF'
import json, sys
p = sys.argv[1]; c = json.load(open(p))
c.update(hidden_size=512, intermediate_size=1024, num_hidden_layers=2, num_attention_heads=4, head_dim=128,
         num_key_value_heads=2)
json.dump(c, open(p, "w"), indent=1)
PYEOF
fi
cp $M/config.json "$OUT/model-config.json"
E=/tmp/sgl-seat-tiny-llama-eagle
if [ ! -f $E/config.json ]; then
  mkdir -p $E && cp $M/* $E/
  "$PY" - "$E/config.json" <<'PYEOF'
import json, sys
p = sys.argv[1]; c = json.load(open(p))
c.update(architectures=["LlamaForCausalLMEagle"], num_hidden_layers=1)
json.dump(c, open(p, "w"), indent=1)
PYEOF
fi
COMMON="--model-path $M --load-format dummy --attention-backend triton --sampling-backend pytorch
  --mem-fraction-static 0.3 --cuda-graph-max-bs-decode 8 --enable-metrics --host 127.0.0.1 --port $PORT"
arm() {
  name=$1; shift; d="$OUT/$name"; mkdir -p "$d"
  echo "python -m sglang.launch_server $COMMON $*" > "$d/argv.txt"
  t0=$(date +%s)
  setsid "$PY" -m sglang.launch_server $COMMON "$@" > "$d/server.log" 2>&1 &
  pid=$!
  for _ in $(seq 1 300); do
    "$PY" -c "import urllib.request as u; u.urlopen('http://127.0.0.1:$PORT/health', timeout=2)" 2>/dev/null && break
    kill -0 $pid 2>/dev/null || break; sleep 1
  done
  echo "ready_s $(( $(date +%s) - t0 ))" > "$d/ready.txt"
  "$PY" - "$PORT" "$d" <<'PYEOF'
import json, sys, time, urllib.request as u
port, d = sys.argv[1], sys.argv[2]
base = f"http://127.0.0.1:{port}"
def get(path):
    return u.urlopen(base + path, timeout=30).read().decode()
open(f"{d}/server_info.json", "w").write(get("/get_server_info"))
answers = []
for i in range(8):
    stream = i >= 4  # the inter-token latency histogram is observed for streamed requests
    body = json.dumps({"model": "default", "prompt": f"request {i}: the quick brown fox", "max_tokens": 32,
                       "temperature": 0, "ignore_eos": True, "stream": stream}).encode()
    req = u.Request(base + "/v1/completions", data=body, headers={"Content-Type": "application/json"})
    t = time.monotonic(); raw = u.urlopen(req, timeout=120).read().decode()
    doc = {"stream_chunks": raw.count("data: ")} if stream else json.loads(raw)
    doc["client_s"] = time.monotonic() - t
    answers.append(doc)
open(f"{d}/answers.json", "w").write(json.dumps(answers, indent=1))
open(f"{d}/metrics.txt", "w").write(get("/metrics"))
PYEOF
  sched=$(pgrep -f "sglang::scheduler" | head -1)
  [ -n "$sched" ] && py-spy dump --pid "$sched" > "$d/pyspy-scheduler.txt" 2>&1
  ps -eo pid,ppid,comm,args --forest | grep -i sglang | grep -v grep > "$d/processes.txt"
  kill -TERM -- -$pid 2>/dev/null; sleep 5; kill -KILL -- -$pid 2>/dev/null
  grep -E "KV Cache is allocated|max_total_num_tokens|max_running_requests|accept" "$d/server.log" | head -20 > "$d/facts.txt"
}
for a in $ARMS; do
  case $a in
    off) arm draft-off ;;
    standalone) arm draft-standalone --speculative-algorithm STANDALONE --speculative-draft-model-path $M \
      --speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4 ;;
    eagle) arm draft-eagle --speculative-algorithm EAGLE --speculative-draft-model-path $E \
      --speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4 ;;
  esac
done
ls -R "$OUT" | head -40
