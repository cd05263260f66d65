"""``attach(..., rules=...)``: a plain loop declares its own rules overrides (which of its knobs change what is learned)
with its registration, as ``POST /v1/jobs`` takes them — against a real local server."""

from __future__ import annotations

import pytest

from tests.support.hook_api import KNOBS
from tests.support.waits import eventually
from trimtab.trainer import attach


def test_a_loop_declares_a_knob_throughput_only_with_its_registration(sqlite_api):
    api = sqlite_api
    token = api.post("/v1/tokens", {"name": "ruled", "scope": "job"}, token=api.admin_token).json()["token"]
    rules = {"learning": {"throughput_only": ["batch_size"]}}
    hook = attach("ruled", api.url, token, knobs=KNOBS, rules=rules, backoff_max_s=0.1)
    try:
        hook.step_end(samples=8)
        got = eventually(lambda: (r := api.get("/v1/jobs/ruled", token=api.admin_token)).status_code == 200 and r.json())
        assert got["rules"]["learning"]["throughput_only"] == ["batch_size"], got["rules"]
    finally:
        hook.close(timeout_s=0.5)


def test_rules_that_are_not_a_mapping_are_refused_at_attach():
    with pytest.raises(TypeError, match="rules must be a mapping in the rules file's shape"):
        attach("ruled", "http://127.0.0.1:9", "tt_x", rules=["learning"])
