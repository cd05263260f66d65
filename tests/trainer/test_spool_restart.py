"""The hook's spool survives the training process (issue 39, item 3): a job killed or closed while no server
answers leaves its reports on disk, and the job started again (same job, same rank, same host) sends them first, in
order, from where the last one's confirmed reports end; two live processes never share one spool (a flock).
(src/trimtab/trainer/report_spool.py, backlog.py)"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from tests.support.fake_server import FakeServer, delivered_in_order
from tests.support.waits import eventually
from tests.trainer.test_hook_failopen import run_steps
from tests.trainer.test_hook_outage import accounted, fake_hook
from trimtab.trainer.report_spool import ReportSpool, SpoolTaken, open_spool, stable_dir_name


def run_again(spool_dir, first: int, n: int) -> tuple[list[int], dict]:
    """The job started again with a server that answers, resumed at ``first`` (its own step numbers) for ``n``
    steps: (the steps the server got, in order; the hook's counts)."""
    up = FakeServer("ok")
    again = fake_hook(up, spool_dir=str(spool_dir))
    try:
        for step in range(first, first + n):
            again.step_end(step=step, samples=again.knobs["batch_size"])
        eventually(lambda: again.stats["pending"] == 0)
    finally:
        again.close(timeout_s=1.0)
    return delivered_in_order(up), again.stats


def test_a_job_closed_while_no_server_answers_leaves_its_reports_and_its_next_run_sends_them_first(tmp_path):
    hook = fake_hook(FakeServer("down"), queue_max=16, spool_dir=str(tmp_path))
    run_steps(hook, 100, sleep_s=0.001)
    hook.close(timeout_s=0.2)
    first = hook.stats
    assert first["left"] == 100 and first["dropped"] == first["sent"] == 0 and accounted(first), first
    got, s = run_again(tmp_path, 100, 30)
    assert got == list(range(130)), "the last run's first, in order, once"
    assert s["inherited"] == 100 and s["sent"] == 130 and s["left"] == s["dropped"] == 0 and accounted(s), s
    assert not list(tmp_path.glob("*/*.jsonl")), "nothing left once sent"


KILLED = textwrap.dedent("""
    import os, sys, time
    from trimtab.trainer import attach
    hook = attach("fake", "http://127.0.0.1:9", "tok", knobs={"batch_size": (8, 1, 64)}, queue_max=16,
                  spool_dir=sys.argv[1], backoff_max_s=0.2)
    for step in range(200):
        time.sleep(0.005)
        hook.step_end(samples=8)
    deadline = time.monotonic() + 60
    while hook.stats["spooled"] < 150 and time.monotonic() < deadline:
        time.sleep(0.05)
    print(hook.stats["dropped"], hook.stats["spooled"], flush=True)
    os._exit(0)  # killed: no close
""")


def test_a_job_killed_during_an_outage_has_its_spooled_reports_sent_by_its_next_run(tmp_path):
    done = subprocess.run([sys.executable, "-c", KILLED, str(tmp_path)], capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    dropped, spooled = map(int, done.stdout.split()[-2:])
    assert spooled >= 150 and dropped == 0, done.stdout
    got, s = run_again(tmp_path, 200, 10)
    assert got == list(range(spooled)) + list(range(200, 210)), "what was on disk, in order, then the new run's"
    assert s["inherited"] == spooled and accounted(s), s


def item(step: int) -> list:
    return [{"step": step, "rank": 0, "step_time_s": 1.0}, 0]


def test_a_spool_picked_up_starts_after_the_reports_its_last_process_had_confirmed(tmp_path):
    spool = ReportSpool(tmp_path / "s", max_bytes=1 << 20)
    spool.append([item(k) for k in range(10)])
    assert [r["step"] for r, _ in spool.peek(4)] == [0, 1, 2, 3]
    spool.commit(4)
    spool.peek(2)  # in flight when the process died: not confirmed, so sent again
    spool.leave()
    again = ReportSpool(tmp_path / "s", max_bytes=1 << 20)
    assert again.adopted == again.records == 6
    assert [r["step"] for r, _ in again.peek(10)] == list(range(4, 10))


def test_a_torn_last_line_is_cut_off_and_the_rest_picked_up(tmp_path, caplog):
    spool = ReportSpool(tmp_path / "s", max_bytes=1 << 20)
    spool.append([item(k) for k in range(3)])
    spool.leave()
    (segment,) = (tmp_path / "s").glob("*.jsonl")
    with segment.open("ab") as f:
        f.write(b'0\t{"step": 3, "ra')  # killed mid-write
    again = ReportSpool(tmp_path / "s", max_bytes=1 << 20)
    assert [r["step"] for r, _ in again.peek(10)] == [0, 1, 2]
    again.append([item(4)])
    again.commit(3)
    assert [r["step"] for r, _ in again.peek(10)] == [4]


def test_two_live_processes_of_one_job_and_rank_never_share_a_spool(tmp_path):
    held = open_spool(tmp_path, "job.rank0", 1 << 20)
    assert held.directory.name == stable_dir_name("job.rank0")
    with pytest.raises(SpoolTaken):
        ReportSpool(held.directory, 1 << 20)
    other = open_spool(tmp_path, "job.rank0", 1 << 20)
    assert other.directory != held.directory and other.directory.name.startswith(held.directory.name + ".")
    other.remove()
    held.remove()
    assert open_spool(tmp_path, "job.rank0", 1 << 20).directory.name == stable_dir_name("job.rank0"), "let go"
