"""The job's token: ``attach`` takes a str (or $TRIMTAB_TOKEN) and refuses anything else at once, and a server
that refuses the token is not an outage — ``stats`` says ``auth_refused``, never ``offline``, one ERROR line names
the server and what to do, and the reports wait and go once the token is accepted (a real local server)."""

from __future__ import annotations

import logging
import time

import pytest

from tests.support.hook_api import KNOBS, reports_of
from tests.support.waits import eventually
from trimtab.paths import BadToken
from trimtab.trainer import attach


@pytest.mark.parametrize("token", [..., b"tt_bytes", 42])
def test_a_token_that_is_not_a_str_is_refused_at_attach_saying_what_to_pass(token):
    with pytest.raises(TypeError, match=r"token must be a str, the secret `trimtab token create` printed"):
        attach("typed", "http://127.0.0.1:9", token=token)


def test_a_str_that_cannot_be_a_token_is_refused_at_attach_too():
    with pytest.raises(BadToken, match="2 lines"):
        attach("typed", "http://127.0.0.1:9", token="tt_one\ntt_two")


def test_trimtab_token_is_used_and_checked_when_no_token_is_passed(monkeypatch):
    monkeypatch.setenv("TRIMTAB_TOKEN", "tt_from env")
    with pytest.raises(BadToken, match=r"\$TRIMTAB_TOKEN is not a token"):
        attach("typed", "http://127.0.0.1:9")
    monkeypatch.setenv("TRIMTAB_TOKEN", " tt_fromenv\n")
    hook = attach("typed", "http://127.0.0.1:9", backoff_max_s=0.2)
    try:
        assert hook._reporter._headers == {"Authorization": "Bearer tt_fromenv"}
    finally:
        hook.close(timeout_s=0.2)


def errors(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR and r.name == "trimtab.trainer"]


def test_an_unknown_token_is_auth_refused_not_offline_and_said_once_at_error(sqlite_api, caplog):
    api = sqlite_api
    caplog.set_level(logging.INFO, logger="trimtab.trainer")
    hook = attach("refused", api.url, "tt_nosuchtoken", knobs=KNOBS, backoff_max_s=0.1)
    try:
        for _ in range(5):
            hook.step_end(samples=8)
        eventually(lambda: hook.stats["auth_refused"])
        time.sleep(0.5)  # several retries, each refused again
        assert not hook.stats["offline"] and hook.stats["pending"] == 5
    finally:
        hook.close(timeout_s=0.3)
    said = errors(caplog)
    assert len(said) == 1, said
    assert f"server {api.url} refused job refused's token (HTTP 401" in said[0]
    assert "unknown or revoked token" in said[0] and "trimtab token create --name refused --scope job" in said[0]
    assert not [r for r in caplog.records if "offline" in r.getMessage()]


def test_a_job_owned_by_another_token_is_refused_until_an_admin_revokes_the_owner_then_nothing_is_lost(
        sqlite_api, caplog):
    api = sqlite_api
    caplog.set_level(logging.INFO, logger="trimtab.trainer")
    owner = api.post("/v1/tokens", {"name": "owner", "scope": "job"}, token=api.admin_token).json()
    assert api.post("/v1/jobs", {"name": "taken", "ranks": 1}, token=owner["token"]).status_code in (200, 201)
    mine = api.post("/v1/tokens", {"name": "mine", "scope": "job"}, token=api.admin_token).json()["token"]
    hook = attach("taken", api.url, mine, knobs=KNOBS, backoff_max_s=0.1)
    try:
        for _ in range(6):
            hook.step_end(samples=8)
        eventually(lambda: hook.stats["auth_refused"])
        assert not hook.stats["offline"] and reports_of(api, "taken") == []
        revoked = api.post(f"/v1/tokens/{owner['id']}", None, token=api.admin_token, method="DELETE")
        assert revoked.status_code == 200
        eventually(lambda: not hook.stats["auth_refused"] and hook.stats["pending"] == 0, timeout_s=10)
        assert {r["step"] for r in reports_of(api, "taken")} == set(range(6))
    finally:
        hook.close(timeout_s=0.5)
    said = errors(caplog)
    assert len(said) == 1 and "(HTTP 403" in said[0] and "may not write job taken" in said[0], said
    assert any("accepts job taken's token now" in r.getMessage() for r in caplog.records)
