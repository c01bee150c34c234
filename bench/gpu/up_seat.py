"""`sgl-seat up` through Ray on real GPUs: a 2-node local seat, 1 GPU per simulated node, a kernel-side stall.

Why: the other GPU benches start the sim by hand; this one goes through the product's own path: ``up`` starts
the local Ray cluster (each simulated node's raylet seeing its own GPU, ``localcluster.node_gpu_env``), the
placement group, the node agents, the engines (sim in CUDA mode: ``SGLSEAT_SIM_DEVICE=auto``) and the watchdog
sidecars; then traffic, a ``gpu-stall`` fault on rank 1 (``--fault gpu-stall:rank=1,after_steps=N``), the bundle
the watchdog writes, and ``down``. Printed as JSON (``--out``/up_seat.json too): seconds per stage, each rank's
``CUDA_VISIBLE_DEVICES`` / sim device as its process sees them and the GPU it holds memory on (nvidia-smi), the
bundle's verdict, and whether ``down`` left any of the seat's processes alive.

    python bench/gpu/up_seat.py --home /tmp/up-home --out DIR     (Ray, py-spy and the sim's wheels installed)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
SEAT = "gpu-sim"


def cli(args: list[str], env: dict[str, str], timeout: float) -> tuple[int, str, str, float]:
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "sgl_seat.cli.main", *args], env=env, capture_output=True, text=True,
                       timeout=timeout, check=False, cwd=str(REPO))
    return p.returncode, p.stdout, p.stderr, round(time.monotonic() - t0, 2)


def write_spec(path: Path, http_port: int) -> Path:
    doc: dict[str, Any] = yaml.safe_load((REPO / "launch" / "seats" / "local-sim.yaml").read_text())
    doc["name"] = SEAT
    doc["python"] = sys.executable
    doc["cluster"].update(nodes=2, gpus_per_node=1, gpu_memory_gb=141)
    doc["parallel"] = {"tp": 2, "ep": 2}
    doc["network"].update(http_port=http_port, dist_init_port=http_port + 5, node_env=[{}, {}])
    del doc["model"]["config"]  # capacity is not the point here
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def proc_env(pid: int, keys: tuple[str, ...]) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError as exc:
        return {"error": str(exc)}
    env = dict(x.decode(errors="replace").split("=", 1) for x in raw if b"=" in x)
    return {k: env.get(k, "") for k in keys}


def gpu_pids() -> dict[str, str]:
    try:
        p = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,gpu_uuid,used_memory", "--format=csv,noheader"],
                           capture_output=True, text=True, check=False, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return {}
    out = {}
    for line in p.stdout.splitlines():
        parts = [x.strip() for x in line.split(",")]
        if len(parts) >= 3:
            out[parts[0]] = f"{parts[1][-8:]} {parts[2]}"
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--home", default="/tmp/h4-gpu")
    ap.add_argument("--port", type=int, default=31000)
    ap.add_argument("--after-steps", type=int, default=300)
    ap.add_argument("--fault", default="gpu-stall",
                    help="fault kind on rank 1 (rowfetch-stall: checks the harness on a CPU machine)")
    ap.add_argument("--bundle-wait-s", type=float, default=90.0)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    home = Path(a.home)
    home.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "SGLSEAT_HOME": str(home), "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "NO_COLOR": "1",
           "COLUMNS": "200"}
    spec = write_spec(home / f"{SEAT}.yaml", a.port)
    res: dict[str, Any] = {"spec": yaml.safe_load(spec.read_text())["cluster"]}
    rc, out, err, secs = cli(["up", "--seat", str(spec), "--fault", f"{a.fault}:rank=1,after_steps={a.after_steps}",
                              "--timeout", "240"], env, 300)
    res["up"] = {"rc": rc, "seconds": secs, "stdout_tail": out[-1500:], "stderr_tail": err[-2500:]}
    print(json.dumps({"up": res["up"]}, indent=1), flush=True)
    pids: list[int] = []
    try:
        if rc != 0:
            return 1
        rc, out, err, _ = cli(["status", SEAT, "--json"], env, 60)
        st = json.loads(out) if rc == 0 else {}
        res["status_state"] = st.get("state")
        ranks = []
        smi = gpu_pids()
        for n in st.get("nodes", []):
            for r in n.get("ranks", []):
                pid = int(r.get("pid") or 0)
                pids.append(pid)
                ranks.append({"node": n.get("node_rank"), "gpu_ids": n.get("gpu_ids"),
                              "tp_rank": r.get("tp_rank"), "pid": pid, "alive": r.get("alive"),
                              **proc_env(pid, ("CUDA_VISIBLE_DEVICES", "SGLSEAT_SIM_DEVICE")),
                              "gpu_memory": smi.get(str(pid))})
        res["ranks"] = ranks
        res["nvidia_smi_apps"] = smi
        print(json.dumps({"status": res["status_state"], "ranks": ranks}, indent=1), flush=True)
        endpoint = next((ln.split("endpoint: ", 1)[1].strip() for ln in res["up"]["stdout_tail"].splitlines()
                         if "endpoint: " in ln), f"http://127.0.0.1:{a.port}")
        from sgl_seat.forensics.recording.loadgen import Load, posting, request_body

        body = request_body("/generate", "hello seat", max_tokens=64)
        load = Load(posting(endpoint, "/generate", lambda i, n: body), concurrency=8, pause_s=0.2, timeout=30.0)
        t0 = time.monotonic()
        load.start()
        bundles = home / "bundles"
        found: Path | None = None
        while time.monotonic() - t0 < a.bundle_wait_s and found is None:
            time.sleep(0.5)
            cands = sorted(p for p in bundles.rglob("manifest.json")) if bundles.exists() else []
            found = cands[0].parent if cands else None
        res["traffic_to_bundle_s"] = round(time.monotonic() - t0, 2) if found else None
        load.halt()
        res["requests_ok_failed"] = [load.ok, load.failed]
        if found is not None:
            time.sleep(2.0)  # let the capture finish writing
            from sgl_seat.forensics import read_bundle

            try:
                b = read_bundle(found)
                v = b.manifest.verdict
                res["bundle"] = {"path": str(found.relative_to(home)),
                                 "verdict": None if v is None else v.kind.value,
                                 "rank": getattr(v, "rank", None), "node": getattr(v, "node", None),
                                 "frame": getattr(v, "frame", None), "evidence": list(getattr(v, "evidence", ()))[:4],
                                 "waiting_ranks": list(getattr(v, "waiting_ranks", ()) or ()),
                                 "probe_records_with_gpu": sum(1 for p in b.probes if p.gpu),
                                 "probe_records": len(b.probes)}
            except Exception as exc:
                res["bundle"] = {"path": str(found), "error": f"{type(exc).__name__}: {exc}"}
        rc, out, err, _ = cli(["bundle", "ls", "--json"], env, 60)
        res["bundle_ls_rc"] = rc
        print(json.dumps({k: res.get(k) for k in ("traffic_to_bundle_s", "requests_ok_failed", "bundle")},
                         indent=1), flush=True)
    finally:
        rc, out, err, secs = cli(["down", SEAT], env, 240)
        res["down"] = {"rc": rc, "seconds": secs, "stdout_tail": out[-800:], "stderr_tail": err[-800:]}
        time.sleep(1.0)
        res["rank_pids_alive_after_down"] = [p for p in pids if p and Path(f"/proc/{p}").exists()]
        print(json.dumps({"down": res["down"], "alive_after": res["rank_pids_alive_after_down"]}, indent=1),
              flush=True)
        if a.out:
            Path(a.out).mkdir(parents=True, exist_ok=True)
            (Path(a.out) / "up_seat.json").write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
