#!/usr/bin/env bash
# The trained model on the GPU machine (issue: real weights on the GPU), across device calls of at most 64 MiB and
# 10 minutes each, back to back while the machine stays warm:
#   bash bench/gpu/trained_device.sh engine            carry .carry/eng .carry/gguf/a: lays out the engine package
#                                                      in /tmp/sgl-seat-eng, keeps the GGUF's first part
#   bash bench/gpu/trained_device.sh seat              carry .carry/site .carry/gguf/b: lays out sgl-seat and Ray
#                                                      in /tmp/sgl-seat-site, keeps the second part
#   bash bench/gpu/trained_device.sh parts             carry .carry/gguf/c (a GGUF part more, where the packages
#                                                      and the working tree leave too little room in the calls
#                                                      above: each call carries at most 64 MiB with the tree)
#   bash bench/gpu/trained_device.sh start ARGS...     carry the last part: joins the parts, checks the GGUF against
#                                                      the pinned sha256 and converts it to bf16 safetensors with the
#                                                      engine package's own transformers (trainedmodel.py ensure),
#                                                      then starts bench/gpu/draft_seat.py --trained with ARGS under
#                                                      setsid (it outlives the call while the machine stays warm)
#                                                      (carry .carry/eaglehead too, eaglehead.py's head for the model
#                                                      in bf16, SGLang's sglang/ directory, 8 MB: it is kept in
#                                                      /tmp/eaglehead, and ARGS may name --eagle-head /tmp/eaglehead
#                                                      for the eagle arm)
#   bash bench/gpu/trained_device.sh gate ARGS...      as start, but the gate's battery on the trained model
#                                                      (bench/gpu/gate_seat.py --trained ... --eagle-head
#                                                      /tmp/eaglehead ARGS: carry .carry/eaglehead with the GGUF's
#                                                      last part), about 15 minutes: then poll
#   bash bench/gpu/trained_device.sh poll [WAIT_S]     waits up to WAIT_S (default 540) for the bench to end
# Each call ends by packing what there is into $OUT/trained-out.tgz. The GGUF (98 MB) is larger than one call's
# carry, so it travels in parts (split here with head/tail; their join is checked by the digest).
set -u
mode=${1:?engine, seat, parts, start, gate or poll}; shift
out=/tmp/trained-out; parts=/tmp/gguf-parts
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
PY=/opt/torch/.venv/bin/python3
[ -x $PY ] || PY=$(command -v python3)
keep_parts() { mkdir -p $parts; for d in .carry/gguf/*/; do [ -d "$d" ] && cp "$d"part-* $parts/ 2>/dev/null; done; ls -la $parts; }
case $mode in
  engine)
    keep_parts
    $PY sgl_seat/engines/offline/hostlayout.py .carry/eng /tmp/sgl-seat-eng --python $PY --no-check | tail -2 ;;
  parts)
    keep_parts ;;
  seat)
    keep_parts
    $PY sgl_seat/engines/offline/hostlayout.py .carry/site /tmp/sgl-seat-site --no-check | tail -2 ;;
  start|gate)
    keep_parts
    rm -rf /tmp/repo && mkdir -p /tmp/repo $out
    tar --exclude=./.carry --exclude=./.venv --exclude=./.venv-sglang -cf - . | tar -xf - -C /tmp/repo
    [ -d .carry/eaglehead ] && rm -rf /tmp/eaglehead && cp -r .carry/eaglehead/sglang /tmp/eaglehead
    cat $parts/part-* > /tmp/smollm2.gguf  # part-0, part-1, ... in order
    export SGLSEAT_CACHE=/tmp/sgl-seat-cache
    t0=$SECONDS
    (cd /tmp/repo && PYTHONPATH=/tmp/repo /tmp/sgl-seat-eng/bin/python sgl_seat/engines/trainedmodel.py ensure \
      --dtype bfloat16 --gguf /tmp/smollm2.gguf --link /tmp/models/smollm2-135m-instruct) > $out/convert.json \
      2> $out/convert.log || { tail -20 $out/convert.log; }
    echo "converted in $((SECONDS - t0)) s: $(head -c 400 $out/convert.json)"
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > $out/gpu.txt
    bench=draft_seat.py; [ "$mode" = gate ] && bench="gate_seat.py --eagle-head /tmp/eaglehead"
    # The bench's end is a file it leaves (its exit status), not its pid: a pid kept by one call did not answer
    # kill -0 in the next (2026-12-07: poll returned at once while the battery ran on).
    rm -f /tmp/trained.done
    (cd /tmp/repo && PYTHONPATH=/tmp/repo:/tmp/sgl-seat-site/site PATH=/tmp/sgl-seat-site/site/bin:$PATH \
       setsid nohup bash -c '"$@"; echo $? > /tmp/trained.done' bench $PY bench/gpu/$bench \
       --engine-venv /tmp/sgl-seat-eng --out $out --trained /tmp/models/smollm2-135m-instruct "$@" \
       > /tmp/trained-run.log 2>&1 < /dev/null &)
    set -- 420 ;;  # meant to end the call within its 600 s (one past it is killed, the bench with it); run 3 was
                   # still cut at 600 s with 420 here, not understood: draft_seat.py keeps each fault on disk as it comes
  poll) ;;
  *) echo "unknown mode $mode" >&2; exit 2 ;;
esac
if [ "$mode" = start ] || [ "$mode" = gate ] || [ "$mode" = poll ]; then
  wait_s=${1:-540}; deadline=$((SECONDS + wait_s))
  while [ $SECONDS -lt $deadline ] && [ ! -f /tmp/trained.done ]; do sleep 5; done
  echo "== bench ($([ -f /tmp/trained.done ] && echo "ended, exit $(cat /tmp/trained.done)" || echo "still running"))"
  tail -25 /tmp/trained-run.log
  nvidia-smi --query-gpu=memory.used --format=csv,noheader
  tar -czf "$OUT/trained-out.tgz" -C /tmp trained-out trained-run.log 2>/dev/null; ls -la "$OUT"
fi
