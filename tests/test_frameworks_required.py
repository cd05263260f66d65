"""tests/support/frameworks.require: a missing framework skips locally, saying why, and fails under CI."""

from __future__ import annotations

import pytest

from tests.support.frameworks import require

MISSING = "trimtab_no_such_framework"


def test_an_installed_module_is_returned(monkeypatch):
    monkeypatch.setenv("TRIMTAB_REQUIRE_FRAMEWORKS", "1")
    assert require("json").dumps([]) == "[]"


def test_a_missing_framework_skips_locally_saying_why(monkeypatch):
    monkeypatch.delenv("TRIMTAB_REQUIRE_FRAMEWORKS", raising=False)
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match=f"{MISSING} is not installed.*No module named"):
        require(MISSING)


@pytest.mark.parametrize("env", [{"TRIMTAB_REQUIRE_FRAMEWORKS": "1"}, {"CI": "true"}])
def test_a_missing_framework_fails_in_ci(monkeypatch, env):
    monkeypatch.delenv("TRIMTAB_REQUIRE_FRAMEWORKS", raising=False)
    monkeypatch.delenv("CI", raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(pytest.fail.Exception, match="forbids skipping"):
        require(MISSING, reason="the framework of this test is missing")
