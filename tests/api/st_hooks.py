"""Loaded by the schemathesis CLI (``SCHEMATHESIS_HOOKS=tests.api.st_hooks``) in tests/api/test_schemathesis.py.

One check of ``--checks all`` is narrowed, for one documented reason: the server has rules no JSON Schema can
state — a knob's min ≤ value ≤ max, a window's end after its start, a rank below the stored job's rank count, a
change the job has, a sample no more than 300 s ahead of the server's clock. It answers those with a 422 whose
every error has type ``value_error`` and names the field. ``positive_data_acceptance_beyond_schema`` accepts
exactly those 422s and is the built-in check otherwise; any other rejection of schema-valid data (a bound, a
pattern or a type the schema gets wrong) still fails the run.
"""

from __future__ import annotations

import json

import schemathesis
from schemathesis.specs.openapi.checks import positive_data_acceptance


def _beyond_the_schema(response) -> bool:
    if response.status_code != 422:
        return False
    try:
        errors = json.loads(response.content)["detail"]
    except (ValueError, KeyError, TypeError):
        return False
    return isinstance(errors, list) and bool(errors) and all(
        isinstance(e, dict) and e.get("type") == "value_error" and e.get("loc") for e in errors)


@schemathesis.check
def positive_data_acceptance_beyond_schema(ctx, response, case):
    if _beyond_the_schema(response):
        return None
    return positive_data_acceptance(ctx, response, case)
