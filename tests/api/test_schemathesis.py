"""A property-based run of the whole OpenAPI document (schemathesis) against the live server: valid and invalid
requests to every operation, with an admin token. Whatever it sends, the server must never answer 5xx, and every
answer must match the documented responses."""

from __future__ import annotations

import time

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable

schemathesis = pytest.importorskip("schemathesis")
from schemathesis.checks import not_a_server_error  # noqa: E402
from schemathesis.specs.openapi.checks import response_schema_conformance, status_code_conformance  # noqa: E402

from tests.api.conftest import SIM_NODE, recent_batch  # noqa: E402

EXAMPLES_PER_OPERATION = {"sqlite": 25, "postgresql": 10}  # PostgreSQL: fewer, to keep the suite < 60 s
KNOWN = {"name": "job-a", "uuid": f"GPU-{SIM_NODE.hostname}-0000"}  # path values that exist, to reach past the 404s


def _seed(api) -> None:
    assert api.ingest(recent_batch(SIM_NODE)).status_code == 200
    job = {"name": "job-a", "ranks": 2, "hostnames": [SIM_NODE.hostname], "device_map": {"actor": [0], "critic": [1]},
           "knobs": {"batch_size": {"value": 8, "min": 1, "max": 64}, "prefetch": {"value": 1, "min": 0, "max": 8}}}
    assert api.post("/v1/jobs", job, scope="job").status_code == 201


def test_no_request_makes_the_server_fail(api):
    _seed(api)
    headers = {"Authorization": f"Bearer {api.admin_token}"}
    schema = schemathesis.openapi.from_url(f"{api.url}/openapi.json")
    # Revoking tokens at random would revoke the run's own admin token; revocation has tests of its own.
    schema = schema.exclude(method="DELETE", path_regex="^/v1/tokens")
    failures: list[str] = []
    checks = [not_a_server_error, status_code_conformance, response_schema_conformance]

    def run(strategy) -> None:
        @settings(max_examples=EXAMPLES_PER_OPERATION[api.ctx.engine.dialect.name], deadline=None, database=None,
                  derandomize=True,
                  phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
        @given(case=strategy)
        def one(case):
            response = case.call(base_url=api.url, headers=headers, timeout=10)
            try:
                case.validate_response(response, checks=checks, headers=headers)
            except (Exception, BaseExceptionGroup) as exc:  # noqa: BLE001 - collected, so one run reports every broken operation
                failures.append(f"{case.method} {case.formatted_path} → {response.status_code}: "
                                f"{' '.join(str(exc).split())[:400]}")
        try:
            one()
        except Unsatisfiable:  # nothing invalid to send (an operation without parameters or body)
            pass

    started = time.monotonic()
    for result in schema.get_all_operations():
        operation = result.ok()
        run(operation.as_strategy(generation_mode=schemathesis.GenerationMode.POSITIVE))
        run(operation.as_strategy(generation_mode=schemathesis.GenerationMode.NEGATIVE))
        known = {p: KNOWN[p] for p in KNOWN if "{" + p + "}" in operation.path}
        if known:
            run(operation.as_strategy(path_parameters=known))
    assert not failures, "\n".join(sorted(set(failures))[:40])
    assert time.monotonic() - started < 60
