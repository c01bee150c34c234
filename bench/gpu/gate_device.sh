#!/usr/bin/env bash
# bench/gpu/gate_seat.py on the device machine, across its calls of at most 10 minutes (the battery is longer):
#   bash bench/gpu/gate_device.sh start [POLL_S]   (carry .carry/seatpkg; the engine package laid out in
#                                                    /tmp/sgl-seat-eng by the call before) copies this checkout to
#                                                    /tmp/repo, lays out the seat package, starts the bench with
#                                                    setsid (it outlives the call while the machine stays warm)
#   bash bench/gpu/gate_device.sh poll [POLL_S]    waits up to POLL_S (default 540) for it to finish
# Each call ends by packing what there is into $OUT/gate-out.tgz (the bench's directory, its log, the seat logs).
set -u
mode=${1:?start or poll}; wait_s=${2:-540}; out=/tmp/gate-out
if [ "$mode" = start ]; then
  rm -rf /tmp/repo && mkdir -p /tmp/repo
  tar --exclude=./.carry --exclude=./.venv --exclude=./.venv-sglang -cf - . | tar -xf - -C /tmp/repo
  /opt/torch/.venv/bin/python3 sgl_seat/engines/offline/hostlayout.py .carry/seatpkg /tmp/sgl-seat-site --no-check | tail -2
  (cd /tmp/repo && PYTHONPATH=/tmp/repo:/tmp/sgl-seat-site/site PATH=/tmp/sgl-seat-site/site/bin:$PATH \
     setsid nohup /opt/torch/.venv/bin/python3 bench/gpu/gate_seat.py --engine-venv /tmp/sgl-seat-eng --out $out \
     > /tmp/gate-run.log 2>&1 < /dev/null &)
fi
deadline=$((SECONDS + wait_s))
while [ $SECONDS -lt $deadline ] && [ ! -f $out/gate_seat.json ]; do sleep 10; done
echo "== progress"; grep -v '^\s*$' $out/progress.log 2>/dev/null | tail -4
echo "== bench"; tail -15 /tmp/gate-run.log
nvidia-smi --query-gpu=memory.used --format=csv,noheader
tar -czf "$OUT/gate-out.tgz" -C /tmp gate-out gate-run.log sgl-seat-home/logs 2>/dev/null; ls -la "$OUT"
