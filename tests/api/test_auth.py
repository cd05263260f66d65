"""Bearer tokens: writes need one of the right scope (admin implies all), reads are open, revocation is
immediate, secrets are shown once and stored only hashed, and the first start leaves an admin token in a 0600 file."""

from __future__ import annotations

import re
import stat

import pytest
from sqlalchemy import select

from trimtab.api.auth import any_tokens, ensure_admin_token
from trimtab.store.engine import open_engine
from trimtab.store.migrate import migrate
from trimtab.store.models import api_tokens
from tests.api.conftest import recent_batch

JOB = {"name": "job-a", "ranks": 2, "knobs": {"batch_size": {"value": 8, "min": 1, "max": 64}}}
# Every write route, with a body valid for it (the scope check must be what refuses them).
WRITES = {
    "agent": [("POST", "/v1/ingest", recent_batch().to_dict())],
    "job": [("POST", "/v1/jobs", JOB), ("POST", "/v1/jobs/job-a/reports", {"step": 1, "rank": 0, "step_time_s": 1.0}),
            ("POST", "/v1/jobs/job-a/report-batches", {"reports": [{"step": 2, "rank": 0, "step_time_s": 1.0}]}),
            ("POST", "/v1/jobs/job-a/acks", {"change_id": 1, "applied_at_step": 2, "rank": 0})],
    "admin": [("PUT", "/v1/jobs/job-a/mode", {"mode": "auto"}),
              ("POST", "/v1/jobs/job-a/changes", {"knob": "batch_size", "value": 16}),
              ("POST", "/v1/tokens", {"name": "x", "scope": "agent"}), ("GET", "/v1/tokens", None),
              ("DELETE", "/v1/tokens/999", None)],
}
ALL_WRITES = [w for ws in WRITES.values() for w in ws]


@pytest.mark.parametrize("method, path, body", ALL_WRITES)
def test_a_write_without_a_valid_token_is_refused_with_401_and_a_bearer_challenge(sqlite_api, method, path, body):
    for headers in ({}, {"Authorization": "Bearer tt_not-a-token"}, {"Authorization": "Basic dXNlcjpwdw=="}):
        r = sqlite_api.http.request(method, path, json=body, headers=headers)
        assert r.status_code == 401, (headers, r.text)
        assert r.headers["WWW-Authenticate"].startswith("Bearer")


@pytest.mark.parametrize("scope", ["agent", "job"])
def test_a_token_may_only_do_what_its_scope_allows(sqlite_api, scope):
    api = sqlite_api
    # The job token registers job-a itself: a job an admin registered is the admins' (see the ownership tests).
    assert api.post("/v1/jobs", JOB, token=api.token("job") if scope == "job" else api.admin_token).status_code == 201
    for needed, writes in WRITES.items():
        for method, path, body in writes:
            r = api.post(path, body, scope=scope, method=method)
            if needed == scope:
                assert r.status_code not in (401, 403), (method, path, r.text)
            else:
                assert r.status_code == 403, (method, path, r.text)
                assert f"scope {needed!r} needed" in r.json()["detail"]


def test_admin_implies_every_scope(sqlite_api):
    api = sqlite_api
    for method, path, body in ALL_WRITES:
        r = api.post(path, body, token=api.admin_token, method=method)
        assert r.status_code not in (401, 403), (method, path, r.text)


def test_reads_need_no_token(sqlite_api):
    for path in ("/healthz", "/v1/nodes", "/v1/gpus", "/v1/balance", "/v1/events", "/v1/jobs", "/v1/decisions",
                 "/openapi.json", "/docs"):
        assert sqlite_api.http.get(path).status_code == 200, path


def test_a_revoked_token_gets_401_at_once_and_revoking_is_idempotent(api):
    created = api.post("/v1/tokens", {"name": "agent@node-a", "scope": "agent"}, token=api.admin_token).json()
    assert api.ingest(recent_batch(), token=created["token"]).status_code == 200
    r = api.post(f"/v1/tokens/{created['id']}", None, token=api.admin_token, method="DELETE")
    assert r.status_code == 200 and r.json()["revoked"] is True and r.json()["revoked_ms"] > 0
    r_revoked_ms = r.json()["revoked_ms"]
    r = api.ingest(recent_batch(), token=created["token"])
    assert r.status_code == 401 and r.json()["detail"] == "unknown or revoked token"
    again = api.post(f"/v1/tokens/{created['id']}", None, token=api.admin_token, method="DELETE").json()
    assert again["revoked"] is True and again["revoked_ms"] == r_revoked_ms
    assert api.post("/v1/tokens/424242", None, token=api.admin_token, method="DELETE").status_code == 404


def test_the_secret_is_shown_once_and_stored_only_as_a_hash(api):
    created = api.post("/v1/tokens", {"name": "ci", "scope": "job"}, token=api.admin_token)
    assert created.status_code == 201
    secret = created.json()["token"]
    assert secret.startswith("tt_") and len(secret) > 40
    listing = api.post("/v1/tokens", None, token=api.admin_token, method="GET")
    assert secret not in listing.text and api.admin_token not in listing.text
    names = {t["name"]: t for t in listing.json()["tokens"]}
    assert names["ci"]["scope"] == "job" and names["ci"]["revoked"] is False and "token" not in names["ci"]
    with api.ctx.engine.connect() as conn:
        stored = conn.execute(select(api_tokens.c.secret_sha256)).scalars().all()
    assert secret not in stored and all(len(h) == 64 for h in stored)


def test_use_of_a_token_is_recorded(sqlite_api):
    api = sqlite_api
    api.ingest(recent_batch())
    tokens = {t["name"]: t for t in api.post("/v1/tokens", None, token=api.admin_token, method="GET").json()["tokens"]}
    assert tokens["test agent"]["last_used_ms"] is not None


def test_first_start_writes_a_working_admin_token_to_a_0600_file(api):
    mode = stat.S_IMODE(api.admin_token_file.stat().st_mode)
    # The fixture's store lies outside its state dir, so the file is named after the store (admin-<db>-<hash>.token).
    assert re.fullmatch(r"admin-[\w.-]+-[0-9a-f]{8}\.token", api.admin_token_file.name) and mode == 0o600
    r = api.post("/v1/tokens", {"name": "from the file", "scope": "agent"}, token=api.admin_token)
    assert r.status_code == 201
    # An admin token exists now: later starts leave the file and the store alone.
    assert ensure_admin_token(api.ctx.engine, api.ctx.state_dir) is None
    assert any_tokens(api.ctx.engine)


def test_a_store_whose_admin_tokens_are_all_revoked_gets_a_new_one(api):
    admin_id = next(t["id"] for t in api.post("/v1/tokens", None, token=api.admin_token, method="GET").json()["tokens"]
                    if t["scope"] == "admin")
    assert api.post(f"/v1/tokens/{admin_id}", None, token=api.admin_token, method="DELETE").status_code == 200
    path = ensure_admin_token(api.ctx.engine, api.ctx.state_dir)
    assert path == api.admin_token_file
    fresh = path.read_text().strip()
    assert fresh != api.admin_token
    assert api.post("/v1/tokens", {"name": "n", "scope": "job"}, token=fresh).status_code == 201


def test_an_empty_store_has_no_tokens(tmp_path):
    engine = open_engine(f"sqlite:///{tmp_path}/t.db")
    migrate(engine)
    try:
        assert not any_tokens(engine)
        assert ensure_admin_token(engine, tmp_path / "state").exists()
        assert any_tokens(engine)
    finally:
        engine.dispose()


def test_a_job_belongs_to_the_job_token_that_registered_it(sqlite_api):
    api = sqlite_api
    owner = api.token("job")
    other = api.post("/v1/tokens", {"name": "other job", "scope": "job"}, token=api.admin_token).json()
    assert api.post("/v1/jobs", JOB, token=owner).status_code == 201
    report = {"step": 1, "rank": 0, "step_time_s": 1.0}
    assert api.post("/v1/jobs/job-a/reports", report, token=other["token"]).status_code == 403
    assert api.post("/v1/jobs", JOB, token=other["token"]).status_code == 403
    assert api.post("/v1/jobs/job-a/reports", report, token=owner).status_code == 200
    assert api.post("/v1/jobs/job-a/reports", {**report, "step": 2}, token=api.admin_token).status_code == 200
    # Once the owner is revoked, another job token may take the job over by registering it again.
    owner_id = next(t["id"] for t in api.post("/v1/tokens", None, token=api.admin_token, method="GET").json()["tokens"]
                    if t["name"] == "test job")
    api.post(f"/v1/tokens/{owner_id}", None, token=api.admin_token, method="DELETE")
    assert api.post("/v1/jobs", JOB, token=other["token"]).status_code == 200
    assert api.post("/v1/jobs/job-a/reports", {**report, "step": 3}, token=other["token"]).status_code == 200


def test_a_job_an_admin_registered_cannot_be_taken_over_by_any_job_token(sqlite_api):
    api = sqlite_api
    assert api.post("/v1/jobs", JOB, token=api.admin_token).status_code == 201
    change = api.post("/v1/jobs/job-a/changes", {"knob": "batch_size", "value": 16}, token=api.admin_token).json()
    job_token = api.token("job")
    report = {"step": 1, "rank": 0, "step_time_s": 1.0}
    ack = {"change_id": change["change_id"], "applied_at_step": 2, "rank": 0}
    takeover = {**JOB, "mode": "auto", "knobs": {"batch_size": {"value": 8, "min": 1, "max": 4096}}}
    for path, body in (("/v1/jobs/job-a/reports", report), ("/v1/jobs/job-a/acks", ack), ("/v1/jobs", takeover)):
        r = api.post(path, body, token=job_token)
        assert r.status_code == 403 and "admin token" in r.json()["detail"], (path, r.text)
    job = api.get("/v1/jobs/job-a").json()
    assert job["knobs"]["batch_size"] == {"value": 8, "min": 1, "max": 64}, "the declaration is the admin's"
    assert api.get("/v1/jobs/job-a/changes").json()["changes"][0]["status"] == "pending", "not acked by the job token"
    assert api.post("/v1/jobs/job-a/reports", report, token=api.admin_token).status_code == 200
    assert api.post("/v1/jobs", JOB, token=api.admin_token).status_code == 200


def test_a_server_on_another_store_in_the_same_state_dir_keeps_the_first_stores_token(tmp_path):
    """The reported loss: `trimtab server --db <new store>` replaced the admin token of the state dir's store."""
    from click.testing import CliRunner

    from trimtab.cli.main import cli

    state = tmp_path / "state"
    own = open_engine(f"sqlite:///{state}/trimtab.db")
    migrate(own)
    first = ensure_admin_token(own, state)
    assert first == state / "admin.token"
    secret = first.read_text()
    res = CliRunner().invoke(cli, ["server", "--db", f"sqlite:///{tmp_path}/other.db", "--state-dir", str(state),
                                   "--port", "0", "--duration", "0.3", "--no-rebalance"])
    assert res.exit_code == 0, res.output
    assert first.read_text() == secret, "the first store's admin token is untouched"
    (other_file,) = state.glob("admin-other-*.token")
    assert f"created the first admin API token in {other_file}" in res.output
    assert other_file.read_text() != secret and other_file.stat().st_mode & 0o777 == 0o600
    assert ensure_admin_token(own, state) is None, "the first store still has its admin token"
    own.dispose()


def test_a_token_file_of_a_store_that_is_gone_is_never_overwritten(tmp_path):
    state = tmp_path / "state"
    engine = open_engine(f"sqlite:///{state}/trimtab.db")
    migrate(engine)
    path = ensure_admin_token(engine, state)
    engine.dispose()
    old = path.read_text()
    for suffix in ("", "-wal", "-shm"):
        (state / f"trimtab.db{suffix}").unlink(missing_ok=True)
    fresh = open_engine(f"sqlite:///{state}/trimtab.db")  # a new store where the old one was
    migrate(fresh)
    try:
        from trimtab.api.auth import TokenFileConflict

        with pytest.raises(TokenFileConflict, match="does not know: it belongs to another store"):
            ensure_admin_token(fresh, state)
        assert path.read_text() == old
        assert not any_tokens(fresh), "no admin token stored whose secret nobody has"
    finally:
        fresh.dispose()


@pytest.mark.parametrize("method, path, body", [w for w in ALL_WRITES if w[2] is not None])
def test_a_malformed_body_without_a_token_is_401_not_422(sqlite_api, method, path, body):
    """The token is checked first: a client without one learns that, whatever its body (FastAPI parses the body
    before the route's dependencies run)."""
    for content in (b"{not json", b"\xff\xfe", b"[" * 5000):
        r = sqlite_api.http.request(method, path, content=content, headers={"Content-Type": "application/json"})
        assert r.status_code == 401, (content[:10], r.text)
        assert r.headers["WWW-Authenticate"].startswith("Bearer")
    r = sqlite_api.http.request(method, path, content=b"{not json", headers={
        "Content-Type": "application/json", "Authorization": f"Bearer {sqlite_api.admin_token}"})
    assert r.status_code == 422 and r.json()["detail"][0]["type"] == "json_invalid", r.text  # with one: 422


@pytest.mark.parametrize("path", ["/v1/jobs/{name}/reports", "/v1/jobs/{name}/report-batches", "/v1/jobs/{name}/acks"])
def test_the_job_loop_s_hot_routes_check_their_token_without_a_thread_hop_of_its_own(path):
    """A report or ack is one hand-off to the thread pool (the route), not two: a ``def`` dependency runs on a
    thread of its own (issue 20, report latency). Their token check is still done: the 401/403 tests above."""
    import inspect
    from fastapi.routing import APIRoute
    from trimtab.api.routes.job_loop import router

    route = next(r for r in router.routes if isinstance(r, APIRoute) and r.path == path and "POST" in r.methods)
    pending, calls = list(route.dependant.dependencies), []
    while pending:
        dep = pending.pop()
        calls.append(dep.call)
        pending.extend(dep.dependencies)
    assert any(getattr(c, "trimtab_scope", None) == "job" for c in calls)
    sync = [getattr(c, "__name__", repr(c)) for c in calls
            if not (inspect.iscoroutinefunction(c) or inspect.iscoroutinefunction(getattr(c, "__call__", None)))]
    assert sync == [], f"{path}: dependencies run on the thread pool: {sync}"
