"""Fixtures shared across test folders: the real PostgreSQL schema-per-test fixture lives with the store tests."""

from tests.store.conftest import pg_url, store_engine  # noqa: F401  (re-exported fixtures)
# The live API on loopback (uvicorn thread, fresh SQLite store), for the trainer hook's tests.
from tests.api.conftest import make_api, migrated_sqlite, sqlite_api, stopping_servers  # noqa: F401,E402
# A real small filesystem (tmpfs) for the disk-full tests.
from tests.support.tmpfs import small_disk  # noqa: F401,E402
# One torch thread for the reference pipeline's tests (pytestmark = pytest.mark.usefixtures("one_cpu_thread")).
from tests.support.torch_threads import one_cpu_thread  # noqa: F401,E402
