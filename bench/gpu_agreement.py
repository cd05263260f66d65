"""Do the agent's readings agree with `nvidia-smi dmon` and with the bytes a known load moved? (H200 check)

Runs `trimtab agent` (real NVML, 1 s ticks, into a temporary SQLite store) for ~25 s while this script drives a
known load on GPU 0 in phases, and `nvidia-smi dmon -s ut` records alongside:

  compute   bf16 matmuls only                      → util ≈ 100 %, SM activity high, PCIe ≈ 0
  h2d       pinned host→device copies of 512 MiB    → PCIe RX ≈ bytes copied / s
  d2h       pinned device→host copies of 512 MiB    → PCIe TX ≈ bytes copied / s
  idle      nothing                                 → util ≈ 0

For each phase it compares, over the phase's interior seconds, the agent's means with dmon's and with the load's
own byte count, and prints the agreement (goal: within 5 %) and which metrics read as unsupported.

    python bench/gpu_agreement.py [--phase-s 6] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

PHASES = ("compute", "h2d", "d2h", "idle")


def drive_load(phase: str, seconds: float) -> dict:
    import torch

    dev = torch.device("cuda:0")
    moved = 0
    t0 = time.time()
    if phase == "compute":
        a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
        b = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
        while time.time() - t0 < seconds:
            for _ in range(20):
                a @ b
            torch.cuda.synchronize()
    elif phase in ("h2d", "d2h"):
        n = 512 * 1024 * 1024
        host = torch.empty(n, dtype=torch.uint8, pin_memory=True)
        devbuf = torch.empty(n, dtype=torch.uint8, device=dev)
        while time.time() - t0 < seconds:
            if phase == "h2d":
                devbuf.copy_(host, non_blocking=True)
            else:
                host.copy_(devbuf, non_blocking=True)
            torch.cuda.synchronize()
            moved += n
    else:
        time.sleep(seconds)
    t1 = time.time()
    torch.cuda.empty_cache()
    return {"phase": phase, "start": t0, "end": t1, "bytes": moved, "bytes_per_s": moved / (t1 - t0)}


class Dmon:
    """`nvidia-smi dmon -s ut -d 1`, each line stamped with the wall clock when read."""

    def __init__(self):
        self.proc = subprocess.Popen(["nvidia-smi", "dmon", "-s", "ut", "-d", "1", "-i", "0"],
                                     stdout=subprocess.PIPE, text=True)
        self.header: list[str] = []
        self.rows: list[tuple[float, dict]] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            if line.startswith("# gpu") or line.startswith("#gpu"):
                self.header = line.lstrip("#").split()
                continue
            if line.startswith("#") or not self.header:
                continue
            vals = line.split()
            if len(vals) != len(self.header):
                continue
            row = {}
            for k, v in zip(self.header, vals):
                try:
                    row[k] = float(v)
                except ValueError:
                    row[k] = None
            self.rows.append((time.time(), row))

    def stop(self):
        self.proc.terminate()
        self.proc.wait(5)

    def mean(self, key: str, start: float, end: float):
        vals = [r[key] for t, r in self.rows if start <= t <= end and r.get(key) is not None]
        return sum(vals) / len(vals) if vals else None


def agent_means(db: str, start: float, end: float) -> dict:
    from sqlalchemy import create_engine, text

    from trimtab.contract.readings import GPU_METRIC_NAMES

    eng = create_engine(db)
    cols = ", ".join(f"AVG({m}) AS {m}" for m in GPU_METRIC_NAMES)
    with eng.connect() as c:
        row = c.execute(text(f"SELECT COUNT(*) AS n, {cols} FROM gpu_samples s JOIN gpus g ON g.id = s.gpu_id "
                             "WHERE g.gpu_index = 0 AND s.ts_ms BETWEEN :a AND :b"),
                        {"a": int(start * 1000), "b": int(end * 1000)}).mappings().one()
    eng.dispose()
    return dict(row)


def unsupported_metrics(db: str) -> list[str]:
    from sqlalchemy import create_engine, text

    from trimtab.contract.readings import GPU_METRIC_NAMES

    eng = create_engine(db)
    with eng.connect() as c:
        out = [m for m in GPU_METRIC_NAMES if c.execute(text(f"SELECT COUNT({m}) FROM gpu_samples")).scalar_one() == 0]
    eng.dispose()
    return out


def pct_diff(a, b):
    if a is None or b is None or b == 0:
        return None
    return 100.0 * (a - b) / b


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--phase-s", type=float, default=6.0)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="trimtab-agree-")
    db = f"sqlite:///{tmp}/agent.db"
    total_s = args.phase_s * len(PHASES) + 5
    agent = subprocess.Popen([sys.executable, "-m", "trimtab.cli.main", "agent", "--db", db, "--interval", "1",
                              "--duration", str(total_s), "--spool-dir", f"{tmp}/spool", "--status-every", "5"],
                             env={**os.environ, "PYTHONUNBUFFERED": "1"})
    dmon = Dmon()
    time.sleep(2.5)  # first GPM sample pair, dmon header
    phases = [drive_load(p, args.phase_s) for p in PHASES]
    agent.wait(timeout=total_s + 30)
    dmon.stop()

    MiB = 1024 * 1024
    results = []
    print(f"{'phase':8} {'metric':22} {'agent':>12} {'dmon':>12} {'load':>12} {'agent-vs-dmon %':>16} {'agent-vs-load %':>16}")
    for ph in phases:
        a0, a1 = ph["start"] + 1.5, ph["end"] - 0.5  # GPM rates average the interval between samples: skip edges
        am = agent_means(db, a0, a1)
        dm_sm, dm_rx, dm_tx = dmon.mean("sm", a0, a1), dmon.mean("rxpci", a0, a1), dmon.mean("txpci", a0, a1)
        rows = [("util_pct", am["util_pct"], dm_sm, None)]
        rows.append(("sm_active_pct", am["sm_active_pct"], None, None))
        load_rx = ph["bytes_per_s"] if ph["phase"] == "h2d" else None
        load_tx = ph["bytes_per_s"] if ph["phase"] == "d2h" else None
        rows.append(("pcie_rx_MiB_per_s", am["pcie_rx_bytes_per_s"] and am["pcie_rx_bytes_per_s"] / MiB,
                     dm_rx and dm_rx * 1e6 / MiB, load_rx and load_rx / MiB))
        rows.append(("pcie_tx_MiB_per_s", am["pcie_tx_bytes_per_s"] and am["pcie_tx_bytes_per_s"] / MiB,
                     dm_tx and dm_tx * 1e6 / MiB, load_tx and load_tx / MiB))
        for metric, a, d, l in rows:
            f = lambda v: "-" if v is None else f"{v:12.1f}"
            dd, dl = pct_diff(a, d), pct_diff(a, l)
            print(f"{ph['phase']:8} {metric:22} {f(a):>12} {f(d):>12} {f(l):>12} "
                  f"{'-' if dd is None else f'{dd:+.1f}':>16} {'-' if dl is None else f'{dl:+.1f}':>16}")
            results.append({"phase": ph["phase"], "metric": metric, "agent": a, "dmon": d, "load": l,
                            "agent_vs_dmon_pct": dd, "agent_vs_load_pct": dl, "agent_samples": am["n"]})
    unsup = unsupported_metrics(db)
    print(f"\nunsupported (NULL in every sample): {', '.join(unsup) or 'none'}")
    print("note: nvidia-smi dmon reports PCIe in MB/s (10^6); converted to MiB/s above")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"phases": phases, "rows": results, "unsupported": unsup}, fh, indent=2)
    shutil.rmtree(tmp, ignore_errors=True)
    return 0 if agent.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
