"""Fixtures of the store tests: a fresh store on a real SQLite file and in a fresh PostgreSQL schema, and a
small factory of batches with known values.

PostgreSQL comes from ``TRIMTAB_TEST_PG_URL`` (default: the local server, trust auth, database ``test``). When
it cannot be reached its tests skip, saying why — unless ``TRIMTAB_REQUIRE_PG=1`` (CI), where they fail.
"""

from __future__ import annotations

import atexit
import functools
import os
import secrets
from urllib.parse import quote

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from trimtab.contract.readings import Batch, GpuInfo, GpuSample, HostSample, NodeInfo
from trimtab.store.engine import open_engine
from trimtab.store.errors import mask_url
from trimtab.store.migrate import migrate

DEFAULT_PG_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
T0_MS = 1_699_999_200_000  # a whole hour in epoch ms (so also a whole minute): test buckets start here


@functools.lru_cache(maxsize=None)
def _pg_admin():
    """(base URL, an autocommit engine on it), or the reason PostgreSQL cannot be used; probed once a run.
    (A plain cached function, not a session fixture: tests/conftest.py re-exports ``pg_url`` alone.)"""
    base = os.environ.get("TRIMTAB_TEST_PG_URL", DEFAULT_PG_URL)
    engine = create_engine(make_url(base), connect_args={"connect_timeout": 3}, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
    except Exception as exc:  # noqa: BLE001 - any failure to reach it means the same thing here
        engine.dispose()
        return f"PostgreSQL at {mask_url(base)} is unreachable ({' '.join(str(getattr(exc, 'orig', exc)).split())})"
    return base, engine


def pg_admin_or_skip():
    """(base URL, admin engine) of the test PostgreSQL; skips without one (fails under TRIMTAB_REQUIRE_PG=1)."""
    probe = _pg_admin()
    if isinstance(probe, str):
        if os.environ.get("TRIMTAB_REQUIRE_PG") == "1":
            pytest.fail(f"{probe}; TRIMTAB_REQUIRE_PG=1 forbids skipping", pytrace=False)
        pytest.skip(f"{probe}; set TRIMTAB_TEST_PG_URL to run the PostgreSQL tests")
    return probe


@pytest.fixture
def pg_url():
    """A URL selecting a fresh, empty schema ``trimtab_t_<random>`` through ``search_path``; dropped after."""
    base, admin = pg_admin_or_skip()
    schema = f"trimtab_t_{secrets.token_hex(4)}"
    with admin.connect() as conn:
        conn.execute(text(f'CREATE SCHEMA "{schema}"'))
    sep = "&" if "?" in base else "?"
    yield f"{base}{sep}options={quote(f'-csearch_path={schema}')}"
    with admin.connect() as conn:
        conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))


_TEMPLATES: list[str] = []  # the migrated templates this process made


def drop_migrated_templates() -> None:
    """Drops this process's templates; tests/conftest.py calls it when the run ends (in each xdist worker)."""
    while _TEMPLATES:
        _drop_database(_TEMPLATES.pop())


@functools.lru_cache(maxsize=None)
def _migrated_template(base: str):
    """A database migrated once per process (pytest-xdist worker), to clone for each test that wants a migrated
    PostgreSQL store: ``CREATE DATABASE … TEMPLATE`` takes ~0.1 s where the migrations take ~1 s. None where this
    role may not create databases (then each test migrates a fresh schema, as ``pg_url`` does)."""
    _, admin = _pg_admin()
    name = f"trimtab_tpl_{secrets.token_hex(4)}"
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
    except Exception:  # noqa: BLE001 - no CREATEDB: fall back to migrating a schema per test
        return None
    _TEMPLATES.append(name)
    atexit.register(_drop_database, name)  # (an xdist worker may end without atexit: see drop_migrated_templates)
    template = open_engine(make_url(base).set(database=name).render_as_string(hide_password=False))
    try:
        migrate(template)
    finally:
        template.dispose()  # a template may have no open connection while it is cloned
    return name


def _drop_database(name: str) -> None:
    probe = _pg_admin()
    if not isinstance(probe, str):
        with probe[1].connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


@pytest.fixture
def pg_migrated_url(request):
    """A URL of a fresh PostgreSQL database cloned from a migrated template; dropped after (with any connection the
    test left open). Without the right to create databases: ``pg_url``'s fresh schema, which the caller migrates."""
    base, admin = pg_admin_or_skip()
    template = _migrated_template(base)
    if template is None:
        yield request.getfixturevalue("pg_url")
        return
    name = f"trimtab_db_{secrets.token_hex(4)}"
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}" TEMPLATE "{template}"'))
    yield make_url(base).set(database=name).render_as_string(hide_password=False)
    _drop_database(name)


@pytest.fixture
def sqlite_url(tmp_path):
    return f"sqlite:///{tmp_path}/store/trimtab.db"  # a directory that does not exist yet: open_engine makes it


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def store_url(request):
    """An empty store's URL, once per backend."""
    return request.getfixturevalue("sqlite_url" if request.param == "sqlite" else "pg_url")


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def engine(request):
    """A migrated, empty store on each backend."""
    url = request.getfixturevalue("sqlite_url" if request.param == "sqlite" else "pg_migrated_url")
    engine = open_engine(url)
    migrate(engine)  # on a PostgreSQL clone of the migrated template: only the check that it is at head
    yield engine
    engine.dispose()


NODE = NodeInfo(hostname="node-a", driver_version="550.54", nvml_version="12.550")


def gpu_info(i: int, uuid_prefix: str = "GPU-", **kw) -> GpuInfo:
    return GpuInfo(uuid=f"{uuid_prefix}{i:04d}", index=i, name="NVIDIA H200", memory_total_bytes=141 * 2**30,
                   pcie_max_gen=5, pcie_max_width=16, pcie_peak_bytes_per_s=63e9, gpm_supported=True, **kw)


def make_batch(ts_list, n_gpus: int = 2, node: NodeInfo = NODE, host: bool = True, inventory: bool = True,
               uuid_prefix: str = "GPU-", **metrics) -> Batch:
    """GPU i at time t reports util_pct = 10*i + (t - T0)/1000 unless ``metrics`` fixes values (a value may be a
    callable of (gpu index, ts_ms)). Other metrics stay None."""
    def value(v, i, t):
        return v(i, t) if callable(v) else v

    samples = [
        GpuSample(gpu_uuid=f"{uuid_prefix}{i:04d}", ts_ms=t,
                  **{"util_pct": 10.0 * i + (t - T0_MS) / 1000, **{k: value(v, i, t) for k, v in metrics.items()}})
        for t in ts_list for i in range(n_gpus)
    ]
    hosts = [HostSample(ts_ms=t, cpu_pct=50.0, mem_total_bytes=2**40) for t in ts_list] if host else []
    return Batch(node=node, gpus=[gpu_info(i, uuid_prefix) for i in range(n_gpus)] if inventory else [],
                 gpu_samples=samples, host_samples=hosts)


def count(engine, table) -> int:
    from sqlalchemy import func, select

    with engine.connect() as conn:
        return conn.execute(select(func.count()).select_from(table)).scalar_one()


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def store_engine(request, tmp_path):
    """A migrated store, once on SQLite and once on a fresh PostgreSQL schema."""
    from trimtab.store.engine import open_engine
    from trimtab.store.migrate import migrate

    url = (f"sqlite:///{tmp_path}/trimtab.db" if request.param == "sqlite"
           else request.getfixturevalue("pg_migrated_url"))
    engine = open_engine(url)
    migrate(engine)
    yield engine
    engine.dispose()
