"""/metrics' GPU-time counters: trimtab_job_gpu_seconds_total{job,role,phase,gpu,hostname} and
trimtab_gpu_idle_seconds_total{job,gpu,cause,hostname}, from the accumulated ledger — they only go up from tick
to tick, a tick at the same moment adds nothing, they add up to wall time × GPUs since the job began, and a scrape
only reads them: the ledger's ticker advances them, never a scrape."""

from __future__ import annotations

import time

from prometheus_client.parser import text_string_to_metric_families

from trimtab.agent.scenarios import PIPELINE_SCHEDULE
from trimtab.grading.ledger.ticker import LedgerTicker, advance_all
from trimtab.store import ledger as ledger_store
from tests.support.pipeline_job import play

STEPS = 30


def scrape(api, at_ms: int = None) -> dict[tuple, float]:
    """The counters after a tick of the ledger at ``at_ms`` (None: no tick, the scrape alone)."""
    if at_ms is not None:
        advance_all(api.ctx.engine, at_ms)
    r = api.http.get("/metrics")
    assert r.status_code == 200
    out = {}
    for family in text_string_to_metric_families(r.text):
        if family.name in ("trimtab_job_gpu_seconds", "trimtab_gpu_idle_seconds"):
            for s in family.samples:
                if s.name.endswith("_total"):
                    assert s.labels.pop("simulated") == "true"  # the pipeline node is a simulated one
                    out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_ledger_counters_only_go_up_and_add_up_to_wall_time(sqlite_api, monkeypatch):
    period_ms = int(PIPELINE_SCHEDULE.period_s * 1000)
    now = int(time.time() * 1000)
    t0_ms = now - now % period_ms - (STEPS + 5) * period_ms
    play(sqlite_api, monkeypatch, t0_ms, steps=STEPS, name="pipe")
    first = scrape(sqlite_api, t0_ms + 150_000)
    second = scrape(sqlite_api, t0_ms + STEPS * period_ms + 60_000)
    again = scrape(sqlite_api, t0_ms + STEPS * period_ms + 60_000)
    assert first and set(first) <= set(second)
    assert all(second[k] >= v for k, v in first.items())
    assert again == second, "a tick at the same moment added GPU time"
    assert scrape(sqlite_api) == second, "a scrape without a tick changed the counters"
    per_gpu: dict[str, float] = {}
    for (_, labels), v in second.items():
        labels = dict(labels)
        assert labels["hostname"] == "pipe-node" and labels["job"] == "pipe"
        per_gpu[labels["gpu"]] = per_gpu.get(labels["gpu"], 0.0) + v
    wall_s = STEPS * PIPELINE_SCHEDULE.period_s + 30  # from the registration, 30 s before the first step, through
    # the last report (the settled end)
    assert set(per_gpu) == {"0", "1", "2", "3"}
    for gpu, total in per_gpu.items():
        assert abs(total - wall_s) <= 0.01 * wall_s, (gpu, total)
    gen = second[("trimtab_job_gpu_seconds_total", (("gpu", "0"), ("hostname", "pipe-node"), ("job", "pipe"),
                                                    ("phase", "generation"), ("role", "actor")))]
    assert abs(gen - 4.0 * STEPS) <= 0.05 * 4.0 * STEPS
    waits = {dict(k[1])["cause"]: v for k, v in second.items() if dict(k[1])["gpu"] == "2"
             and k[0] == "trimtab_gpu_idle_seconds_total"}
    assert {"waiting_for_actor", "waiting_for_reward", "host"} <= set(waits) <= {
        "waiting_for_actor", "waiting_for_reward", "host", "no_job"}
    assert abs(waits.get("no_job", 0.0) - 30) <= 0.01 * wall_s  # before the first step


def test_a_scrape_advances_nothing_the_ticker_does(sqlite_api, monkeypatch):
    period_ms = int(PIPELINE_SCHEDULE.period_s * 1000)
    now = int(time.time() * 1000)
    t0_ms = now - now % period_ms - (STEPS + 5) * period_ms
    play(sqlite_api, monkeypatch, t0_ms, steps=STEPS, name="pipe")
    engine = sqlite_api.ctx.engine
    for _ in range(3):
        assert scrape(sqlite_api) == {}  # the jobs are due, yet a scrape neither computes nor stores them
    assert ledger_store.accumulated(engine) == []
    times = iter([t0_ms + 150_000])  # the first tick early in the job (a first tick starts at most 5 min back)
    ticker = LedgerTicker(engine, period_s=0.05, clock=lambda: next(times, t0_ms + STEPS * period_ms + 60_000)).start()
    try:
        deadline = time.monotonic() + 10
        while ticker.ticks < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        ticker.stop()
    assert ticker.ticks >= 2 and ticker.health()["state"] == "ok"
    counted = scrape(sqlite_api)
    assert sum(counted.values()) > 0.99 * 4 * (STEPS * PIPELINE_SCHEDULE.period_s + 30)  # 4 GPUs' wall time


def test_a_failing_tick_is_reported_and_the_next_one_goes_on(sqlite_api, monkeypatch):
    import trimtab.grading.ledger.ticker as ticker_module

    ticker = LedgerTicker(sqlite_api.ctx.engine, clock=lambda: 1_000_000)

    def down(*_a, **_k):
        raise OSError("store unreachable")

    monkeypatch.setattr(ticker_module, "advance_ledgers", down)
    assert ticker.tick() == 0
    assert ticker.health()["state"] == "failing" and "store unreachable" in ticker.health()["last_error"]
    monkeypatch.undo()
    ticker.tick()
    assert ticker.health() == {"state": "ok", "period_s": ticker.period_s, "ticks": 1, "failures": 1,
                               "last_error": None}
