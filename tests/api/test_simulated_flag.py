"""On a machine whose only node is simulated (stored as '<host>-sim'), everything about it says simulated: its
events, and the jobs that run there (they report under the plain host name)."""

from trimtab.contract.readings import NodeInfo
from tests.api.conftest import recent_batch

SIM = NodeInfo(hostname="gpu-box-sim", simulated=True, scenario="actor-hot")
JOB = {"name": "ppo-here", "ranks": 1, "hostnames": ["gpu-box"],
       "knobs": {"batch_size": {"value": 8, "min": 1, "max": 64}}}


def test_a_job_and_the_events_on_a_simulated_only_machine_say_simulated(sqlite_api):
    api = sqlite_api
    assert api.ingest(recent_batch(SIM)).status_code == 200
    assert api.post("/v1/jobs", JOB, scope="job").status_code == 201
    jobs = api.get("/v1/jobs").json()
    assert jobs["simulated"] is True and jobs["jobs"][0]["simulated"] is True
    assert api.get("/v1/jobs/ppo-here").json()["simulated"] is True
    events = api.get("/v1/events").json()
    assert events["events"] == [] and events["simulated"] is True
    assert api.get("/v1/events", node="gpu-box-sim").json()["simulated"] is True


def test_a_host_with_a_real_node_too_is_not_called_simulated(sqlite_api):
    api = sqlite_api
    assert api.ingest(recent_batch(SIM)).status_code == 200
    assert api.ingest(recent_batch(NodeInfo(hostname="gpu-box", driver_version="550.54"))).status_code == 200
    assert api.post("/v1/jobs", JOB, scope="job").status_code == 201
    assert api.get("/v1/jobs/ppo-here").json()["simulated"] is False
    assert api.get("/v1/events").json()["simulated"] is False, "not every node is simulated"
    assert api.get("/v1/events", node="gpu-box-sim").json()["simulated"] is True
