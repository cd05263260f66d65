"""GET /v1/jobs/{name}/gpu-time: parameters checked with errors that name them; a job without reports is all
no_job, and still adds up."""

from __future__ import annotations

import pytest


def _job(api) -> None:
    r = api.post("/v1/jobs", {"name": "j", "ranks": 1, "hostnames": ["h"], "device_map": {"actor": [0, 1]}},
                 scope="job")
    assert r.status_code in (200, 201), r.text


@pytest.mark.parametrize("params, words", [
    ({"window": "ten minutes"}, "not a duration"),
    ({"window": "0s"}, "from 1 s"),
    ({"window": "30d"}, "7 days"),
    ({"window": "10m", "interval": "1h"}, "longer than window"),
    ({"window": "2h", "interval": "1s"}, "more than 1000 intervals"),
    ({"window": "10m", "end_ms": -1}, "greater than or equal"),
])
def test_bad_parameters_are_a_422_naming_them(sqlite_api, params, words):
    _job(sqlite_api)
    r = sqlite_api.get("/v1/jobs/j/gpu-time", **params)
    assert r.status_code == 422, r.text
    assert words in r.text


def test_an_unknown_job_is_a_404(sqlite_api):
    r = sqlite_api.get("/v1/jobs/nope/gpu-time", window="10m")
    assert r.status_code == 404 and "nope" in r.text


def test_a_job_that_never_reported_is_no_job_on_each_of_its_gpus(sqlite_api):
    _job(sqlite_api)
    r = sqlite_api.get("/v1/jobs/j/gpu-time", window="10m", interval="5m", end_ms=1_800_000_000_000)
    body = r.json()
    assert r.status_code == 200 and body["gpus"] == ["h:0", "h:1"]
    assert body["busy_gpu_s"] == 0 and body["idle_gpu_s"] == body["wall_gpu_s"] == 1200
    assert {(t["gpu"], t["cause"]) for t in body["totals"]} == {(0, "no_job"), (1, "no_job")}
    assert len(body["cells"]) == 4
