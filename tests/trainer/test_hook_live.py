"""The hook against the live API (uvicorn on loopback, fresh SQLite store): reports arrive with their phases and
attribution, bounds hold on both sides, and an OOM costs one step and a smaller batch, not the job."""

from __future__ import annotations

import logging
import os
import socket
import time

import pytest
import torch

from tests.support.hook_api import KNOBS, reports_of
from tests.support.waits import eventually
from trimtab.trainer import attach

DEVICE_MAP = {"actor": [0, 1], "ref": [0, 1], "critic": [2], "reward": [3]}


@pytest.fixture
def hooks():
    """Hooks made by a test, closed after it even when it fails."""
    made = []

    def make(*args, **kw):
        made.append(attach(*args, **kw))
        return made[-1]

    yield make
    for hook in made:
        hook.close(timeout_s=0.5)


def test_reports_arrive_with_phases_samples_and_gpu_attribution(sqlite_api, hooks):
    api = sqlite_api
    hook = hooks("ppo-live", api.url, api.token("job"), device_map=DEVICE_MAP, knobs=KNOBS, local_gpu=1)
    for _ in range(4):
        with hook.phase("generation"):
            time.sleep(0.004)
        with hook.phase("evaluation"):
            time.sleep(0.002)
        with hook.phase("communication"):
            pass
        hook.step_end(samples=hook.knobs["batch_size"], tokens=1000)
    assert hook.last_report.component == "actor+ref" and hook.last_report.samples_per_s > 0
    reports = eventually(lambda: len(reports_of(api, "ppo-live")) == 4 and reports_of(api, "ppo-live"))
    assert [r["step"] for r in reports] == [3, 2, 1, 0]
    for r in reports:
        assert r["generation_s"] >= 0.004 and r["evaluation_s"] >= 0.002 and r["update_s"] is None
        assert r["step_time_s"] >= r["generation_s"] + r["evaluation_s"] + r["other_s"] - 1e-6
        assert (r["samples"], r["tokens"], r["rank"]) == (8, 1000, 0)
        assert (r["pid"], r["hostname"], r["local_gpu"]) == (os.getpid(), socket.gethostname(), 1)
        assert r["fragmentation"] is None  # CPU: no allocator statistics, omitted rather than 0
    job = api.get("/v1/jobs/ppo-live").json()
    assert job["ranks"] == 1 and job["device_map"] == DEVICE_MAP and job["mode"] == "advise"
    assert job["knobs"]["batch_size"] == {"value": 8, "min": 1, "max": 64}


def test_a_change_outside_the_declared_bounds_is_refused_by_the_api(sqlite_api, hooks):
    api = sqlite_api
    hooks("bounded", api.url, api.token("job"), knobs=KNOBS)
    eventually(lambda: api.get("/v1/jobs/bounded").status_code == 200)
    for change in ({"knob": "batch_size", "value": 65}, {"knob": "prefetch", "value": -1},
                   {"knob": "batch_size", "value": 12.5}):
        r = api.post("/v1/jobs/bounded/changes", change, token=api.admin_token)
        assert r.status_code == 422, r.text
    assert api.get("/v1/jobs/bounded/changes").json()["changes"] == []


def test_a_start_value_outside_its_bounds_is_clamped_on_the_job_side(sqlite_api, hooks, caplog):
    api = sqlite_api
    with caplog.at_level(logging.WARNING, logger="trimtab.trainer"):
        hook = hooks("clamped", api.url, api.token("job"),
                     knobs={"batch_size": (100, 1, 64), "lr_scale": (0.5, 0.1, 1.0)})
    assert dict(hook.knobs) == {"batch_size": 64, "lr_scale": 0.5} and isinstance(hook.knobs["batch_size"], int)
    assert "clamped to 64" in caplog.text
    with pytest.raises(TypeError):
        hook.knobs["batch_size"] = 3  # read-only: only a step boundary changes a knob
    knobs = eventually(lambda: api.get("/v1/jobs/clamped").status_code == 200 and api.get("/v1/jobs/clamped").json())
    assert knobs["knobs"]["batch_size"]["value"] == 64


def test_an_oom_costs_one_step_halves_the_batch_and_tells_the_server_its_new_ceiling(sqlite_api, hooks):
    api = sqlite_api
    hook = hooks("oomy", api.url, api.token("job"), knobs=KNOBS)
    changes = []
    hook.on_change(lambda *c: changes.append(c))
    sizes, lost = [], []
    for step in range(6):
        sizes.append(hook.knobs["batch_size"])
        with hook.oom_guard():
            with hook.phase("generation"):
                if step == 2:
                    raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")
                if step == 4:
                    raise RuntimeError("CUDA error: out of memory")  # the older/plain form is an OOM too
        if hook.last_oom:
            lost.append((hook.last_oom.step, hook.last_oom.batch_size, hook.last_oom.new_batch_size))
            hook.step_end(samples=0)
            continue
        hook.step_end(samples=sizes[-1])
    assert sizes == [8, 8, 8, 4, 4, 2] and lost == [(2, 8, 4), (4, 4, 2)]
    assert changes == [("batch_size", 8, 4, None), ("batch_size", 4, 2, None)]
    assert hook.stats["ooms"] == 2 and hook.last_report.oom is None
    with pytest.raises(RuntimeError, match="shape mismatch"), hook.oom_guard():
        raise RuntimeError("shape mismatch")  # not an OOM: not the guard's business
    reports = eventually(lambda: len(reports_of(api, "oomy")) == 6 and reports_of(api, "oomy"))
    assert {r["step"]: r["num_ooms"] for r in reports} == {5: None, 4: 2, 3: None, 2: 1, 1: None, 0: None}
    job = eventually(lambda: (j := api.get("/v1/jobs/oomy").json())["knobs"]["batch_size"]["max"] == 3 and j)
    assert job["knobs"]["batch_size"] == {"value": 2, "min": 1, "max": 3}  # never back to a size that failed
    r = api.post("/v1/jobs/oomy/changes", {"knob": "batch_size", "value": 8}, token=api.admin_token)
    assert r.status_code == 422  # the rebalancer cannot go back above it either
