"""Fixtures shared across test folders: the real PostgreSQL schema-per-test fixture lives with the store tests."""

import os

import pytest

from tests.store.conftest import pg_migrated_url, pg_url, store_engine  # noqa: F401  (re-exported fixtures)
from tests.store.conftest import drop_migrated_templates  # noqa: E402
# The live API on loopback (uvicorn thread, fresh SQLite store), for the trainer hook's tests.
from tests.api.conftest import make_api, migrated_sqlite, sqlite_api, stopping_servers  # noqa: F401,E402
# A real small filesystem (tmpfs) for the disk-full tests.
from tests.support.tmpfs import small_disk  # noqa: F401,E402
# One torch thread for the reference pipeline's tests (pytestmark = pytest.mark.usefixtures("one_cpu_thread")).
from tests.support.torch_threads import one_cpu_thread  # noqa: F401,E402
from tests.support import xdist_groups  # noqa: E402


@pytest.hookimpl(tryfirst=True)  # before xdist turns the groups into node ids
def pytest_collection_modifyitems(config, items):
    """Under xdist: the verl tests on one worker (one Ray), a module-scoped fixture's module on one worker, and
    the ``serial`` tests after all others, alone (tests/support/xdist_groups.py)."""
    if config.pluginmanager.hasplugin("xdist"):
        xdist_groups.add_groups(items)


def pytest_sessionfinish(session):
    drop_migrated_templates()


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    return xdist_groups.make_scheduler(config, log)


@pytest.fixture(autouse=True, scope="session")
def torch_cache_in_this_run(tmp_path_factory):
    """torch makes its compile cache directory (``torchinductor_<user>``) in the temporary directory when the first
    optimizer is built; keep it in this run's pytest directory (children inherit it), so a suite run leaves nothing
    of its own in /tmp."""
    if "TORCHINDUCTOR_CACHE_DIR" in os.environ:
        yield
        return
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(tmp_path_factory.mktemp("torchinductor"))
    try:
        yield
    finally:
        os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
