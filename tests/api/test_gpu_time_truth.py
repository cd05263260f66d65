"""The GPU-time ledger against the truth: a simulated 4-GPU node plays the ``pipeline`` scenario (each GPU's
utilization follows its role's phases, trimtab.agent.scenarios.PIPELINE_SCHEDULE), and a synthetic four-process job
placed actor: [0, 1], critic: [2], reward: [3] posts its step reports through the HTTP API, each stamped when its
step ended (plus a little delivery latency; one rank's reports queued through an outage and sent together). The
test computes the true GPU-seconds of every role, phase and wait from the schedule itself — busy = the phases'
kernel time, host = the rest of non-wait phases, a wait is for the roles whose GPUs work at that moment (split
evenly) — and checks every cell of ``GET /v1/jobs/{name}/gpu-time`` within 5 %, busy + idle within 1 % of wall ×
GPUs."""

from __future__ import annotations

import pytest

from trimtab.agent.scenarios import PIPELINE_SCHEDULE
from tests.support.pipeline_job import EDGE_S, STEPS, play, truth

@pytest.mark.parametrize("interval", [None, "60s"])
def test_every_ledger_cell_is_within_5_percent_of_the_schedules_truth(api, monkeypatch, interval):
    import time

    period_ms = int(PIPELINE_SCHEDULE.period_s * 1000)
    now = int(time.time() * 1000)
    t0_ms = now - now % period_ms - (STEPS + 6) * period_ms
    play(api, monkeypatch, t0_ms)
    window_s = STEPS * PIPELINE_SCHEDULE.period_s + 2 * EDGE_S
    end_ms = t0_ms + STEPS * period_ms + EDGE_S * 1000
    r = api.get("/v1/jobs/pipe/gpu-time", window=f"{window_s:g}s", end_ms=end_ms, interval=interval)
    assert r.status_code == 200, r.text
    body = r.json()
    assert abs(body["busy_gpu_s"] + body["idle_gpu_s"] - body["wall_gpu_s"]) <= 0.01 * body["wall_gpu_s"]
    assert body["wall_gpu_s"] == pytest.approx(4 * window_s)
    got: dict[tuple, float] = {}
    for t in body["totals"]:
        key = (t["gpu"], t["kind"], t["role"], t["phase"] or t["cause"], t["waiting_for"] or "")
        got[key] = got.get(key, 0.0) + t["gpu_s"]
    expected = truth(PIPELINE_SCHEDULE.period_s, STEPS, EDGE_S)
    misses = {k: (round(got.get(k, 0.0), 2), round(v, 2)) for k, v in expected.items()
              if abs(got.get(k, 0.0) - v) > 0.05 * v}
    extra = {k: round(v, 2) for k, v in got.items() if k not in expected and v > 0.01 * window_s}
    assert not misses and not extra, f"ledger vs truth: {misses}; cells the truth has not: {extra}"
    print({k: (round(got.get(k, 0.0), 3), round(v, 3)) for k, v in sorted(expected.items())})
