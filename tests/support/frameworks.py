"""The frameworks the integration tests run against (verl, trl, transformers, lightning, torch, …): installed by
``pip install -e '.[dev]'``. Locally a missing one skips its tests, saying why; in CI (``CI=true``, or
``TRIMTAB_REQUIRE_FRAMEWORKS=1`` as .ci/run exports, like TRIMTAB_REQUIRE_PG) it fails them: a broken dev install
must not pass green with skips."""

from __future__ import annotations

import importlib
import os
from types import ModuleType
from typing import Optional

import pytest


def frameworks_required() -> bool:
    return os.environ.get("TRIMTAB_REQUIRE_FRAMEWORKS") == "1" or os.environ.get("CI", "").lower() in ("true", "1")


def require(module: str, reason: Optional[str] = None) -> ModuleType:
    """``module`` imported; if it cannot be, the test (or the whole module, at import) skips, or fails under CI."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        why = f"{reason or f'{module} is not installed'} ({type(exc).__name__}: {exc}; pip install -e '.[dev]')"
        if frameworks_required():
            pytest.fail(f"{why}: CI / TRIMTAB_REQUIRE_FRAMEWORKS=1 forbids skipping", pytrace=False)
        pytest.skip(why, allow_module_level=True)
