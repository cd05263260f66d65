"""A store outage mid-run loses nothing and duplicates nothing: the agent spools, then replays in order.

The outage is real: the agent talks to the real PostgreSQL through a loopback TCP forwarder that the test cuts
(open connections reset, new ones refused) and later restores.
"""

import threading
from urllib.parse import urlsplit, urlunsplit

import pytest
from sqlalchemy import func, select

from trimtab.agent.runner import Agent, make_sources
from trimtab.store.sink import StoreSink
from trimtab.store.engine import open_engine
from trimtab.store.models import gpu_samples, host_samples
from tests.support.tcpproxy import TcpProxy
from tests.support.waits import eventually

pytestmark = pytest.mark.postgres


def via_proxy(url: str, port: int) -> str:
    parts = urlsplit(url)
    user = parts.netloc.split("@")[0]
    return urlunsplit(parts._replace(netloc=f"{user}@127.0.0.1:{port}"))


def test_every_sample_arrives_exactly_once_across_an_outage(pg_url, tmp_path):
    target = urlsplit(pg_url)
    proxy = TcpProxy(target.hostname, target.port or 5432).start()
    produced = []
    agent = Agent(make_sources(simulate=2, scenario="balanced"), StoreSink(via_proxy(pg_url, proxy.port)),
                  tmp_path / "spool", interval_s=0.05, hostname="outage-node", on_batch=produced.append)
    agent.writer.retry_max_s = 0.5
    stop = threading.Event()
    runner = threading.Thread(target=agent.run, args=(stop,), kwargs={"duration_s": 5.0})
    runner.start()
    eventually(lambda: agent.writer.status.rows_written > 0, timeout_s=30)   # the agent is writing …
    proxy.stop()                      # … when the store goes away
    eventually(lambda: agent.writer.status.batches_spooled >= 3, timeout_s=30)   # an outage of several batches
    spooled_during_outage = agent.writer.status.batches_spooled
    assert not agent.writer.status.sink_ok
    proxy.start()                     # … and comes back on the same address
    runner.join(timeout=30)
    proxy.stop()

    assert spooled_during_outage > 0, "the outage must have sent batches to the spool"
    assert agent.spool.is_empty(), "everything spooled was replayed"
    expected = {(s.gpu_uuid, s.ts_ms) for b in produced for s in b.gpu_samples}
    engine = open_engine(pg_url)
    with engine.connect() as conn:
        from trimtab.store.models import gpus

        rows = conn.execute(select(gpus.c.uuid, gpu_samples.c.ts_ms).join(gpus, gpus.c.id == gpu_samples.c.gpu_id)).all()
        n_host = conn.execute(select(func.count()).select_from(host_samples)).scalar_one()
    engine.dispose()
    stored = [(u, t) for u, t in rows]
    assert len(stored) == len(set(stored)), "no duplicates"
    assert set(stored) == expected, f"missing {len(expected - set(stored))}, extra {len(set(stored) - expected)}"
    assert n_host == len(produced)
