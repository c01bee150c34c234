#!/usr/bin/env bash
# The gate on real vLLM (issue 48), as bench/results/gate-vllm-cpu-2026-12-06/ was measured: three batteries of
# baseline, candidate (NGRAM) and control on the local-vllm seat (copy greedy, random words greedy, random words
# sampled: refused since, below), `tune draft` from the copy battery, then baseline against the hybrid (the tuned
# schedule) on the greedy words one. About 45 minutes on 2 cores; needs .venv-vllm (bash scripts/setup.sh --engine vllm). Writes under $OUT
# (default /tmp/vllm-gate); ports 24740-24760; its own $SGLSEAT_HOME. Keep the machine quiet: the figures are timings.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-/tmp/vllm-gate}; mkdir -p "$out"
export SGLSEAT_HOME=$out/home
seat=$out/seat.yaml
sed 's/^name: local-vllm/name: vgate/; s/http_port: 31250/http_port: 24740/; s/dist_init_port: 31255/dist_init_port: 24745/' \
  launch/seats/local-vllm.yaml > "$seat"
gate() {  # NAME ARMS WORKLOADS [SEAT]: one battery, its report as JSON and text
  local name=$1 arms=$2 work=$3 s=${4:-$seat}
  .venv/bin/sgl-seat gate --seat "$s" --arms "$arms" --workloads "$work" --out "$out/$name" --json \
    > "$out/$name.json" 2> "$out/$name.err" || true   # its verdict is in its exit status (0 SHIP, 1, 3); kept
  .venv/bin/python -c "import json,sys; from sgl_seat.gate.report_text import render_text; \
print(render_text(json.load(open(sys.argv[1]))))" "$out/$name/report.json" | tee "$out/$name.txt"
}
gate copy baseline,candidate,control bench/vllm/gate-workloads.yaml
sed 's/temperature: 0.7, ignore_eos: false/temperature: 0.0, ignore_eos: true/' bench/vllm/gate-workloads-words.yaml \
  > "$out/words-greedy.yaml"
gate words-greedy baseline,candidate,control "$out/words-greedy.yaml"
# The sampled battery (gate-workloads-words.yaml) is refused since: vLLM 0.32's CPU engine corrupts sampled answers
# while it speculates (docs/vllm-cpu.md); the results README says what that did to the figures measured with it.
cp "$seat" "$out/tuned.yaml"
.venv/bin/sgl-seat tune draft "$out/copy/report.json" --seat "$out/tuned.yaml" | tee "$out/tune.txt"
gate hybrid baseline,hybrid "$out/words-greedy.yaml" "$out/tuned.yaml"
