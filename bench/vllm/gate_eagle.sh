#!/usr/bin/env bash
# The gate on real vLLM with a trained draft: the EAGLE head of sgl_seat/engines/eaglehead.py (trained from the
# model's own answers) as the candidate against draft off, with the A/A control, on users' chat requests
# (bench/vllm/gate-workloads-chat.yaml, greedy: this engine corrupts sampled answers while it drafts); then the same battery with NGRAM as the candidate, side by side.
# If the EAGLE battery gives a crossover, `tune draft` writes draft.off_above and the hybrid is gated against the
# baseline. About 35-50 minutes on 2 cores; needs .venv-vllm and a head (HEAD, default the bench's cache path:
# python bench/vllm/eagle_acceptance.py trains one when absent). Writes under $OUT (default /tmp/vllm-gate-eagle);
# ports 24740-24760; its own $SGLSEAT_HOME. Keep the machine quiet: the figures are timings.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-/tmp/vllm-gate-eagle}; mkdir -p "$out"
head=${HEAD:-${SGLSEAT_CACHE:-$HOME/.cache/sgl-seat}/models/smollm2-135m-eagle-head-seed0/vllm}
[ -f "$head/config.json" ] || { echo "no EAGLE head at $head (see this file's header)" >&2; exit 2; }
export SGLSEAT_HOME=$out/home
work=bench/vllm/gate-workloads-chat.yaml
seat() {  # NAME [ALGORITHM]: the local-vllm seat renamed, its ports moved, the draft set
  .venv/bin/python - "$1" "${2:-NGRAM}" "$head" "$out/$1.yaml" <<'PY'
import sys, yaml
name, algo, head, dest = sys.argv[1:]
doc = yaml.safe_load(open("launch/seats/local-vllm.yaml"))
doc["name"] = name
doc["network"].update(http_port=24740, dist_init_port=24745)
if algo == "EAGLE":
    doc["draft"].update(algorithm="EAGLE", steps=3, topk=1, draft_tokens=4, model_path=head)
open(dest, "w").write(yaml.safe_dump(doc, sort_keys=False))
PY
}
gate() {  # NAME ARMS SEAT: one battery, its report as JSON and text
  .venv/bin/sgl-seat gate --seat "$3" --arms "$2" --workloads "$work" --out "$out/$1" --json \
    > "$out/$1.json" 2> "$out/$1.err" || true   # its verdict is in its exit status (0 SHIP, 1, 3); kept
  .venv/bin/python -c "import json,sys; from sgl_seat.gate.report_text import render_text; \
print(render_text(json.load(open(sys.argv[1]))))" "$out/$1/report.json" | tee "$out/$1.txt"
}
seat vgate-eagle EAGLE
gate eagle-chat baseline,candidate,control "$out/vgate-eagle.yaml"
seat vgate-ngram NGRAM
gate ngram-chat baseline,candidate,control "$out/vgate-ngram.yaml"
cp "$out/vgate-eagle.yaml" "$out/tuned.yaml"
if .venv/bin/sgl-seat tune draft "$out/eagle-chat/report.json" --seat "$out/tuned.yaml" | tee "$out/tune.txt"; then
  gate eagle-hybrid baseline,hybrid "$out/tuned.yaml"
fi
