"""The GPU-time ledger's parts on small cases: the step timeline (late reports sent together), a step's account
(GPU time below wall time is host work; phases longer than the step are scaled and say so), two processes on one
GPU, a role that sends no reports (with and without per-process activity), a wait without samples, and the
accumulated ledger's advance (a constant number of statements; two servers never add the same time)."""

from __future__ import annotations

import pytest
from sqlalchemy import event

from trimtab.contract.roles import RolePlacement
from trimtab.grading.ledger.attribute import GpuTrace
from trimtab.grading.ledger.compute import compute_ledger
from trimtab.grading.ledger.model import GpuKey
from trimtab.grading.ledger.read import advance_ledgers
from trimtab.grading.ledger.timeline import account_of, step_spans
from trimtab.store import jobs as job_store
from trimtab.store import ledger as ledger_store
from trimtab.store.engine import open_engine
from trimtab.store.migrate import migrate

ACTOR = [RolePlacement("actor", "h", (0,), (10,))]


def rep(step, end_ms, rank=0, pid=10, gpu=0, **phases):
    return {"rank": rank, "step": step, "received_ms": end_ms, "step_time_s": 10.0, "pid": pid, "hostname": "h",
            "local_gpu": gpu, **phases}


def totals(ledger):
    return {k[2:]: round(v, 6) for k, v in ledger.totals().items()}


def test_reports_sent_together_after_an_outage_are_laid_back_to_back():
    spans, _ = step_spans([rep(s, 100_000) for s in range(1, 6)], ACTOR, {}, ["h"])
    assert [(s.step, s.start_ms, s.end_ms) for s in spans] == [
        (1, 50_000, 60_000), (2, 60_000, 70_000), (3, 70_000, 80_000), (4, 80_000, 90_000), (5, 90_000, 100_000)]


def test_gpu_time_below_wall_time_is_host_work_and_overlong_phases_are_scaled():
    a = account_of({"step_time_s": 10.0, "generation_s": 6.0, "gpu_generation_s": 4.0, "wait_s": 2.0})
    assert a.busy_s == {"generation": 4.0} and a.idle_s == {"waiting": 2.0, "host": 4.0} and not a.scaled
    b = account_of({"step_time_s": 10.0, "update_s": 8.0, "communication_s": 4.0, "wait_s": 4.0})
    assert b.scaled and sum(b.busy_s.values()) + sum(b.idle_s.values()) == pytest.approx(10.0)
    assert b.busy_s["update"] == pytest.approx(5.0)


def test_two_processes_on_one_gpu_never_add_up_to_more_than_its_wall_time():
    roles = [RolePlacement("actor", "h", (0,), (10,)), RolePlacement("reward", "h", (0,), (11,))]
    reports = [rep(1, 10_000, update_s=6.0, gpu_update_s=6.0),
               rep(1, 10_000, rank=1, pid=11, evaluation_s=7.0, gpu_evaluation_s=7.0)]
    ledger = compute_ledger("j", 0, 10_000, 10_000, reports, roles, {}, ["h"], {})
    assert ledger.busy_gpu_s + ledger.idle_gpu_s == pytest.approx(10.0)
    got = totals(ledger)
    assert got[("busy", "actor", "update", "")] == pytest.approx(10 * 6 / 13)
    assert any("overlapping ranks" in n for n in ledger.notes)
    assert all(c.estimated and "scaled" in c.sources for c in ledger.cells)


def test_a_role_without_reports_is_busy_for_its_process_activity_else_its_gpus_utilization():
    roles = ACTOR + [RolePlacement("reward", "h", (1,), (11,))]
    trace = {GpuKey("h", 1): GpuTrace(list(range(0, 10_000, 1000)), [40.0] * 10)}
    measured = compute_ledger("j", 0, 10_000, 10_000, [rep(1, 10_000, update_s=10.0)], roles, {}, ["h"], trace,
                              process_busy_pct={("h", 1, 11): 25.0})
    cell = next(c for c in measured.cells if c.gpu == 1 and c.kind == "busy")
    assert (cell.role, cell.name, cell.gpu_s, cell.estimated, cell.sources) == (
        "reward", "unreported", 2.5, True, ("process_activity",))  # a share of NVML's samples: an estimate
    assert any("mean SM utilization over the time NVML's per-process records cover" in n for n in measured.notes)
    guessed = compute_ledger("j", 0, 10_000, 10_000, [rep(1, 10_000, update_s=10.0)], roles, {}, ["h"], trace)
    cell = next(c for c in guessed.cells if c.gpu == 1 and c.kind == "busy")
    assert (cell.gpu_s, cell.estimated, cell.sources) == (4.0, True, ("gpu_samples",))
    assert any("sends no step reports" in n for n in guessed.notes)
    assert totals(guessed)[("idle", "reward", "unknown", "")] == pytest.approx(6.0)


def test_a_wait_without_samples_is_for_an_unknown_role_and_says_so():
    ledger = compute_ledger("j", 0, 10_000, 10_000, [rep(1, 10_000, wait_s=4.0, update_s=6.0)], ACTOR, {}, ["h"], {})
    cell = next(c for c in ledger.cells if c.name == "waiting")
    assert cell.waiting_for == "unknown" and cell.estimated and cell.gpu_s == pytest.approx(4.0)
    assert any("no GPU samples" in n for n in ledger.notes)


@pytest.fixture
def engine(tmp_path):
    engine = open_engine(f"sqlite:///{tmp_path}/ledger.db")
    migrate(engine)
    yield engine
    engine.dispose()


def _jobs(engine, n: int, monkeypatch):
    out = []
    for i in range(n):
        monkeypatch.setattr(job_store, "now_ms", lambda: 1_000_000)
        job, _ = job_store.register_job(engine, f"j{i}", 1, {"actor": [i]}, ["h"], {}, "off", None, True)
        for step in range(1, 21):
            monkeypatch.setattr(job_store, "now_ms", lambda s=step: 1_000_000 + 10_000 * s)
            job_store.add_report(engine, job.id, dict(step=step, rank=0, step_time_s=10.0, update_s=6.0, pid=1,
                                                      hostname="h", local_gpu=i))
        out.append(job_store.get_job(engine, f"j{i}"))
    return out


def _statements(engine, fn) -> int:
    seen = []
    listener = lambda conn, cursor, statement, *rest: seen.append(statement.split()[0])  # noqa: E731
    event.listen(engine, "before_cursor_execute", listener)
    try:
        fn()
    finally:
        event.remove(engine, "before_cursor_execute", listener)
    return sum(1 for s in seen if s != "BEGIN")


@pytest.mark.parametrize("n_jobs", [1, 4])
def test_an_advance_costs_the_same_statements_for_one_job_or_many(engine, monkeypatch, n_jobs):
    jobs = _jobs(engine, n_jobs, monkeypatch)
    now = 1_000_000 + 10_000 * 21
    assert _statements(engine, lambda: advance_ledgers(engine, jobs, now)) == 6  # through, reports x2, GPU ids
    # (no samples: the store has no GPUs), the state's insert (jobs seen for the first time), the cells' upsert
    rows = ledger_store.accumulated(engine)
    for job in jobs:
        busy = sum(r.gpu_s for r in rows if r.job == job.name and r.kind == "busy")
        assert busy == pytest.approx(20 * 6.0)


def test_two_servers_never_add_the_same_time(engine, monkeypatch):
    jobs = _jobs(engine, 2, monkeypatch)
    now = 1_000_000 + 10_000 * 12
    assert advance_ledgers(engine, jobs, now) == 2
    stale = ledger_store.ledger_through(engine, [j.id for j in jobs])
    assert advance_ledgers(engine, jobs, now + 50_000) == 2
    before = ledger_store.accumulated(engine)
    # a second server read the state before the first advanced: its compare-and-set fails, it adds nothing
    monkeypatch.setattr(ledger_store, "ledger_through", lambda *_: stale)
    assert advance_ledgers(engine, jobs, now + 50_000) == 0
    assert ledger_store.accumulated(engine) == before


def test_a_silent_role_sharing_a_gpu_with_a_reporting_rank_takes_its_busy_time_from_the_idle_time():
    roles = ACTOR + [RolePlacement("reward", "h", (0,), (11,))]
    reports = [rep(1, 10_000, update_s=4.0, gpu_update_s=4.0, wait_s=6.0)]
    trace = {GpuKey("h", 0): GpuTrace(list(range(0, 10_000, 1000)), [70.0] * 10)}
    measured = compute_ledger("j", 0, 10_000, 10_000, reports, roles, {}, ["h"], trace,
                              process_busy_pct={("h", 0, 11): 30.0})
    got = totals(measured)
    assert got[("busy", "reward", "unreported", "")] == pytest.approx(3.0)
    assert got[("busy", "actor", "update", "")] == pytest.approx(4.0)
    assert measured.busy_gpu_s + measured.idle_gpu_s == pytest.approx(10.0)
    guessed = compute_ledger("j", 0, 10_000, 10_000, reports, roles, {}, ["h"], trace)
    cell = next(c for c in guessed.cells if c.role == "reward")
    assert cell.gpu_s == pytest.approx(3.0) and cell.estimated and cell.sources == ("gpu_samples",)
    assert any("reward shares it" in n for n in guessed.notes)


def test_after_an_outage_of_the_daemon_each_advance_catches_up_at_most_five_minutes(engine, monkeypatch):
    (job,) = _jobs(engine, 1, monkeypatch)
    assert advance_ledgers(engine, [job], 1_050_000) == 1
    first = ledger_store.ledger_through(engine, [job.id])[job.id]
    assert advance_ledgers(engine, [job], 5_000_000) == 1
    assert ledger_store.ledger_through(engine, [job.id])[job.id] == first + 300_000


def test_per_process_busy_is_smutil_times_covered_seconds_over_the_time_covered():
    from trimtab.grading.ledger.shares import busy_pct_by_process

    # pid 10: 3 busy s of the 10 its rows cover; 11: 1 of 4 (it came later); 12: idle (0 over 10); 13: no time covered
    got = busy_pct_by_process({("h", 0): {10: (3.0, 10.0), 11: (1.0, 4.0), 12: (0.0, 10.0), 13: (0.0, 0.0)}})
    assert got == {("h", 0, 10): pytest.approx(30.0), ("h", 0, 11): pytest.approx(25.0), ("h", 0, 12): 0.0}
    assert busy_pct_by_process({("h", 1): {10: (12.0, 10.0)}}) == {("h", 1, 10): 100.0}  # never above the wall time


def test_the_store_fed_ledger_splits_a_shared_gpu_by_per_process_shares(engine, monkeypatch):
    """An actor rank reporting 4 s of update in each 10 s step shares GPU 0 with a silent reward process: the
    store's process rows say the reward's mean SM utilization over the 5 s each covers is 15 %: the reward is busy
    15 % of the time, estimated, and the notes say how (its share of the two's SM % × the GPU's 60 % would say
    16.4 %: the estimator before NVML's records were read as averages over the time they cover)."""
    from trimtab.contract.readings import GpuProcess
    from trimtab.store.ingest import BatchWriter
    from trimtab.grading.ledger.read import job_ledger
    from tests.store.conftest import NODE, make_batch

    host, t0 = NODE.hostname, 1_000_000
    batch = make_batch(list(range(t0, t0 + 100_000, 1000)), n_gpus=1, util_pct=60.0)
    uuid = batch.gpus[0].uuid
    batch.processes.extend(GpuProcess(uuid, ts, pid, sm_util_pct=sm, util_samples=5, util_from_ms=ts - 5000,
                                      util_to_ms=ts) for ts in range(t0 + 5000, t0 + 100_001, 5000)
                           for pid, sm in ((10, 40.0), (11, 15.0)))
    writer = BatchWriter(engine)
    writer.write(batch)
    writer.close()
    monkeypatch.setattr(job_store, "now_ms", lambda: t0)
    roles = [RolePlacement("actor", host, (0,), (10,)), RolePlacement("reward", host, (0,), (11,))]
    job, _ = job_store.register_job(engine, "shared", 1, {}, [host], {}, "off", None, True, roles=roles)
    for step in range(1, 11):
        monkeypatch.setattr(job_store, "now_ms", lambda s=step: t0 + 10_000 * s)
        job_store.add_report(engine, job.id, dict(step=step, rank=0, step_time_s=10.0, update_s=4.0, gpu_update_s=4.0,
                                                  pid=10, hostname=host, local_gpu=0))
    ledger = job_ledger(engine, job_store.get_job(engine, "shared"), t0, t0 + 100_000)
    got = {k[2:]: v for k, v in ledger.totals().items()}
    assert got[("busy", "reward", "unreported", "")] == pytest.approx(0.15 * 100.0, rel=0.02)
    assert got[("busy", "actor", "update", "")] == pytest.approx(40.0)
    cell = next(c for c in ledger.cells if c.role == "reward")
    assert cell.estimated and cell.sources == ("process_activity",)
    assert any("reward) sends no step reports: its busy time is its processes' mean SM utilization" in n
               for n in ledger.notes)
    assert ledger.busy_gpu_s + ledger.idle_gpu_s == pytest.approx(100.0)
