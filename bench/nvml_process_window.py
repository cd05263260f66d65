"""What does one NVML per-process utilization record cover? (issue 40; a GPU check)

One child process runs a known duty cycle on GPU ``--gpu`` (bursts of 4096² bf16 matmuls, ``busy`` ms of every
``period`` ms, each burst timed with CUDA events); this script reads ``nvmlDeviceGetProcessUtilization`` at a cadence,
passing as ``lastSeenTimeStamp`` the newest record time of the previous read, and prints, per pattern and cadence,
the child's own CUDA-event busy seconds against two estimators: smUtil × the time since the previous *read*, and
smUtil × the time since the previous *record's timestamp*; and the first records beside the child's true busy
percent over the same read interval and over the 200 ms before the record. It answers whether a record is one
driver sampling period (0.2 s) or the average since ``lastSeenTimeStamp`` — the agent's attribution rests on it.
Also the per-process calls' cost. Prints one JSON object per trial. Exit 2 (one line) without a CUDA GPU or NVML.

    python3 bench/nvml_process_window.py [--gpu 0]
"""

import multiprocessing as mp, time, sys, json, statistics, os

def child(pattern, seconds, ready, go, q):
    import torch
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16); b = torch.randn_like(a); c = torch.empty_like(a)
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(10): torch.mm(a, b, out=c)
    s.record()
    for _ in range(50): torch.mm(a, b, out=c)
    e.record(); e.synchronize(); per_ms = s.elapsed_time(e) / 50
    busy_ms, period_ms = pattern
    reps = max(1, int(busy_ms / per_ms))
    ready.set(); go.wait()
    bursts = []; until = time.time() + seconds
    while time.time() < until:
        w0 = time.time(); s.record()
        for _ in range(reps): torch.mm(a, b, out=c)
        e.record(); e.synchronize(); w1 = time.time()
        bursts.append((w0, w1, s.elapsed_time(e) / 1000))
        time.sleep(max(0, period_ms / 1000 - (w1 - w0)))
    q.put(bursts)

def busy_in(bursts, t0, t1):
    tot = 0.0
    for w0, w1, b in bursts:
        inside = max(0.0, min(w1, t1) - max(w0, t0))
        tot += b * inside / (w1 - w0) if w1 > w0 else 0
    return tot

def trial(nv, h, pattern, cadence, seconds):
    ctx = mp.get_context("spawn"); ready, go, q = ctx.Event(), ctx.Event(), ctx.Queue()
    p = ctx.Process(target=child, args=(pattern, seconds, ready, go, q)); p.start(); ready.wait(120)
    go.set(); t_go = time.time(); last_seen = 0; reads = []
    first = True
    while time.time() < t_go + seconds:
        t_call = time.time()
        try:
            got = nv.nvmlDeviceGetProcessUtilization(h, last_seen)
            recs = [(g.pid, g.timeStamp, g.smUtil, g.memUtil) for g in got if g.pid == p.pid]
            if got: last_seen = max(last_seen, *(g.timeStamp for g in got))
        except nv.NVMLError as exc:
            recs = [("err", str(exc))]
        if not first: reads.append((t_call, recs))
        first = False
        time.sleep(cadence)
    bursts = q.get(timeout=120); p.join(30)
    truth_total = busy_in(bursts, reads[0][0], reads[-1][0])
    # estimators
    est_prevread, est_prevts, rows, prev_call, prev_ts = 0.0, 0.0, [], reads[0][0], None
    for t_call, recs in reads[1:]:
        tr = busy_in(bursts, prev_call, t_call) / (t_call - prev_call)
        for r in recs:
            if r[0] == "err": continue
            ts_s = r[1] / 1e6
            est_prevread += r[2] / 100 * (t_call - prev_call)
            if prev_ts is not None: est_prevts += r[2] / 100 * (ts_s - prev_ts)
            prev_ts = ts_s
            rows.append(dict(call=round(t_call - t_go, 3), ts_lag=round(t_call - ts_s, 3), sm=r[2], truth_pct=round(100 * tr, 1),
                             truth_last200=round(100 * busy_in(bursts, ts_s - 0.2, ts_s) / 0.2, 1)))
        if not recs: rows.append(dict(call=round(t_call - t_go, 3), sm=None, truth_pct=round(100 * tr, 1)))
        prev_call = t_call
    truth_span = busy_in(bursts, reads[1][0] - (reads[1][0] - reads[0][0]), reads[-1][0])
    return dict(pattern=pattern, cadence=cadence, truth_s=round(truth_total, 3), est_prevread=round(est_prevread, 3),
                est_prevts=round(est_prevts, 3), ratio_prevread=round(est_prevread / truth_total, 3) if truth_total else None,
                ratio_prevts=round(est_prevts / truth_total, 3) if truth_total else None, rows=rows[:14])

def cost(nv, h):
    out = {}
    for name in ("nvmlDeviceGetProcessUtilization", "nvmlDeviceGetProcessesUtilizationInfo"):
        fn = getattr(nv, name, None)
        if fn is None: out[name] = "absent"; continue
        walls, cpus = [], []
        for _ in range(30):
            w, c = time.perf_counter(), time.process_time()
            try: fn(h, 0)
            except Exception as exc: out[name] = f"error {exc}"; break
            walls.append(time.perf_counter() - w); cpus.append(time.process_time() - c)
        else:
            out[name] = dict(wall_ms_median=round(1000 * statistics.median(walls), 3), cpu_ms_median=round(1000 * statistics.median(cpus), 3))
    for name, call in (("utilization_rates", lambda: nv.nvmlDeviceGetUtilizationRates(h)), ("memory_info", lambda: nv.nvmlDeviceGetMemoryInfo(h))):
        walls = []
        for _ in range(30):
            w = time.perf_counter(); call(); walls.append(time.perf_counter() - w)
        out[name] = dict(wall_ms_median=round(1000 * statistics.median(walls), 3))
    return out

def main(argv=None) -> int:
    import argparse
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpu", type=int, default=0, help="the GPU (NVML and CUDA index) the child runs on")
    args = ap.parse_args(argv)
    try:
        import torch
        import pynvml as nv
    except ImportError as exc:
        print(f"nvml_process_window: needs torch with CUDA and pynvml ({exc}); run it on a GPU machine", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("nvml_process_window: needs a CUDA GPU (torch sees none here); run it on a GPU machine", file=sys.stderr)
        return 2
    os.environ["CUDA_VISIBLE_DEVICES"] = str(args.gpu)
    nv.nvmlInit(); h = nv.nvmlDeviceGetHandleByIndex(args.gpu)
    print(json.dumps(dict(cost_idle=cost(nv, h))), flush=True)
    res = []
    for pattern, cadence in (((30, 100), 1.0), ((600, 2000), 1.0), ((600, 2000), 5.0), ((130, 700), 1.0), ((130, 700), 5.0)):
        r = trial(nv, h, pattern, cadence, 22 if cadence == 1.0 else 32)
        print(json.dumps(r), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
