"""An acknowledgement means applied: the hook acks a change only when the code that owns the knob says it took
effect, and a change that code cannot apply is refused — stored as such, never acked, the old value kept — against
the live API (uvicorn on loopback, fresh SQLite store)."""

from __future__ import annotations

import time

import pytest

from tests.support.waits import eventually
from trimtab.trainer import attach
from trimtab.trainer.apply import KnobChange


class Deferred:
    """Installs a value and says "applied" only when told the framework's next call carried it."""

    def __init__(self):
        self.waiting: list[KnobChange] = []

    def apply(self, change: KnobChange) -> None:
        self.waiting.append(change)

    def framework_called(self, at_step: int) -> None:
        for change in self.waiting:
            change.applied(at_step)
        self.waiting.clear()


class Refuses:
    def apply(self, change: KnobChange) -> None:
        change.refused(f"{change.knob} is fixed when the workers start")


class Broken:
    def apply(self, change: KnobChange) -> None:
        raise KeyError("no such config key")


def change_of(api, job: str, change_id: int) -> dict:
    changes = api.get(f"/v1/jobs/{job}/changes").json()["changes"]
    return next(c for c in changes if c["change_id"] == change_id)


def queue(api, job: str, knob: str, value) -> int:
    r = api.post(f"/v1/jobs/{job}/changes", {"knob": knob, "value": value}, scope="admin")
    assert r.status_code == 201, r.text
    return r.json()["change_id"]


@pytest.fixture
def hook_for(sqlite_api):
    made = []

    def make(job: str, **kw):
        made.append(attach(job, sqlite_api.url, sqlite_api.token("job"), **kw))
        eventually(lambda: sqlite_api.get(f"/v1/jobs/{job}").status_code == 200)
        return made[-1]

    yield make
    for hook in made:
        hook.close(timeout_s=0.5)


def steps_until(hook, predicate, timeout_s: float = 10.0):
    """Steps of ~20 ms until ``predicate()`` (the change rides on a report's response, posted from a thread)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        time.sleep(0.02)
        hook.step_end(samples=1)
        if predicate():
            return
    raise AssertionError("the change never reached the hook")


def test_a_change_is_acknowledged_only_once_its_owner_says_it_took_effect(sqlite_api, hook_for):
    api, owner = sqlite_api, Deferred()
    hook = hook_for("deferred", knobs={"batch_size": (8, 1, 64)}, appliers={"batch_size": owner})
    cid = queue(api, "deferred", "batch_size", 16)
    steps_until(hook, lambda: bool(owner.waiting))
    assert hook.knobs["batch_size"] == 16 and owner.waiting[0].change_id == cid
    for _ in range(5):  # boundaries pass; the framework has not used the value yet
        hook.step_end(samples=1)
    assert change_of(api, "deferred", cid)["status"] == "pending"
    owner.framework_called(at_step=hook.step)
    acked_step = hook.step
    applied = eventually(lambda: change_of(api, "deferred", cid)["status"] == "applied"
                         and change_of(api, "deferred", cid))
    assert applied["applied_step"] == acked_step and applied["acks"][0]["applied_at_step"] == acked_step
    assert api.get("/v1/jobs/deferred").json()["knobs"]["batch_size"]["value"] == 16


@pytest.mark.parametrize("owner, why", [(Refuses(), "batch_size is fixed when the workers start"),
                                        (Broken(), "KeyError")], ids=["refuses", "raises"])
def test_a_change_its_owner_cannot_apply_is_refused_and_the_old_value_kept(sqlite_api, hook_for, owner, why):
    api = sqlite_api
    hook = hook_for("stubborn", knobs={"batch_size": (8, 1, 64)}, appliers={"batch_size": owner})
    cid = queue(api, "stubborn", "batch_size", 32)
    steps_until(hook, lambda: bool(hook.last_changes))
    assert hook.last_changes[0].status == "refused" and hook.knobs["batch_size"] == 8
    refused = eventually(lambda: change_of(api, "stubborn", cid)["status"] == "refused"
                         and change_of(api, "stubborn", cid))
    assert why in refused["refused_reason"] and refused["refused_reason"].startswith("rank 0: ")
    assert refused["acks"] == [] and refused["applied_step"] is None
    assert api.get("/v1/jobs/stubborn").json()["knobs"]["batch_size"]["value"] == 8
    for _ in range(3):
        hook.step_end(samples=1)
    assert hook.knobs["batch_size"] == 8  # not retried by the hook either


def test_a_knob_the_loop_reads_is_applied_at_the_boundary_as_before(sqlite_api, hook_for):
    api = sqlite_api
    hook = hook_for("plain", knobs={"prefetch": (0, 0, 4)})
    cid = queue(api, "plain", "prefetch", 2)
    steps_until(hook, lambda: hook.knobs["prefetch"] == 2)
    applied_at = hook.step
    assert eventually(lambda: change_of(api, "plain", cid)["applied_step"] == applied_at)


def test_appliers_for_knobs_the_job_did_not_declare_are_an_error():
    with pytest.raises(ValueError, match="appliers for undeclared knobs: sync_every"):
        attach("nope", None, knobs={"batch_size": (8, 1, 64)}, appliers={"sync_every": Refuses()})
