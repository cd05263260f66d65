"""The reference pipeline's GPU-time ledger as a user sees it: ``trimtab up`` (the agent on this machine's GPUs, or
a simulated node without a driver, labelled so), the reference PPO job at a fixed setting reporting to it, then what
``trimtab check`` prints and ``GET /v1/jobs/{name}/gpu-time`` answers (issue 40: "the reference pipeline's ledger in
the README, as check prints it").

Nothing is staged: the daemon is the shipped ``trimtab up`` on a loopback port and a temporary state directory, the
job is ``python -m trimtab.workload`` with ``--server``, and both are stopped at the end.

    python3 bench/pipeline_ledger.py [--config tiny] [--device-map cpu] [--steps 40] [--knobs 64,2,4]
                                     [--window 600] [--json]

On the lent GPU: ``python3 bench/pipeline_ledger.py --config h200 --device-map cuda:0 --steps 60``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
JOB = "ppo-ledger"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env() -> dict:
    env = dict(os.environ)
    src = str(ROOT / "src")
    env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def _say(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def _wait_healthy(base: str, proc: subprocess.Popen, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"trimtab up exited with {proc.returncode} before it answered")
        try:
            if httpx.get(f"{base}/healthz", timeout=1.0).status_code in (200, 503):
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise SystemExit(f"trimtab up did not answer {base}/healthz within {timeout_s:.0f} s")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default="tiny", help="the workload's config (tiny on a CPU, h200 on a GPU)")
    ap.add_argument("--device-map", default="cpu", help="cpu | cuda:0 | the workload's device-map forms")
    ap.add_argument("--steps", type=int, default=40, help="steps of the job")
    ap.add_argument("--knobs", default="64,2,4", help="batch_size,prefetch,sync_every the job runs at")
    ap.add_argument("--window", type=float, default=600.0, help="seconds check and the ledger read back")
    ap.add_argument("--interval", type=float, default=0.5, help="the agent's sampling period, seconds")
    ap.add_argument("--json", action="store_true", help="print the ledger's JSON too")
    args = ap.parse_args(argv)
    batch, prefetch, sync = (int(x) for x in args.knobs.split(","))
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory(prefix="trimtab-ledger-") as state:
        env = {**_env(), "TRIMTAB_STATE_DIR": state}
        _say(f"starting trimtab up on {base} (state {state})")
        up = subprocess.Popen([sys.executable, "-m", "trimtab.cli.main", "up", "--port", str(port), "--interval",
                               str(args.interval)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              text=True, start_new_session=True)
        try:
            _wait_healthy(base, up)
            token = (Path(state) / "admin.token").read_text().strip()
            _say(f"running the reference job {JOB}: config {args.config}, {args.device_map}, {args.steps} steps at "
                 f"{batch}/{prefetch}/{sync}")
            t0 = time.monotonic()
            job = subprocess.run([sys.executable, "-m", "trimtab.workload", "--config", args.config, "--device-map",
                                  args.device_map, "--steps", str(args.steps), "--batch-size", str(batch),
                                  "--prefetch", str(prefetch), "--sync-every", str(sync), "--server", base,
                                  "--token", token, "--job", JOB, "--mode", "advise", "--quiet"],
                                 env=env, capture_output=True, text=True)
            if job.returncode != 0:
                print(job.stdout[-2000:], job.stderr[-4000:], sep="\n", file=sys.stderr)
                raise SystemExit(f"the reference job exited with {job.returncode}")
            _say(f"the job ran {time.monotonic() - t0:.1f} s; waiting for its last reports and a sample")
            time.sleep(max(2.0, 3 * args.interval))
            check = subprocess.run([sys.executable, "-m", "trimtab.cli.main", "check", "--server", base, "--window",
                                    f"{args.window:g}"], env={**env, "TRIMTAB_TOKEN": token}, capture_output=True,
                                   text=True)
            print(f"\n$ trimtab check --server {base} --window {args.window:g}   (exit {check.returncode})")
            print(check.stdout.rstrip())
            if check.stderr.strip():
                print(check.stderr.rstrip())
            ledger = httpx.get(f"{base}/v1/jobs/{JOB}/gpu-time", params={"window": f"{int(args.window)}s"},
                               headers={"Authorization": f"Bearer {token}"}, timeout=30.0)
            print(f"\nGET /v1/jobs/{JOB}/gpu-time?window={int(args.window)}s → {ledger.status_code}")
            body = ledger.json()
            totals = {k: body.get(k) for k in ("busy_gpu_s", "idle_gpu_s", "wall_gpu_s", "simulated")}
            print(json.dumps(totals))
            if args.json:
                print(json.dumps(body, indent=1)[:20000])
            return 0 if ledger.status_code == 200 and check.returncode in (0, 1) else 1
        finally:
            os.killpg(up.pid, signal.SIGTERM)
            try:
                up.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(up.pid, signal.SIGKILL)


if __name__ == "__main__":
    raise SystemExit(main())
