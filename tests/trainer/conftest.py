"""Fixtures shared by the trainer tests: one local Ray for every verl test of the session."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def verl_ray():
    """One ``ray.init(num_cpus=2, include_dashboard=False)`` for the whole session (``verl_harness._ensure_ray``:
    the V1/legacy harness starts it the same way on first use, so every verl test shares this one start)."""
    pytest.importorskip("verl")
    from tests.trainer import verl_harness

    verl_harness._ensure_ray()
    yield
