"""SQLite on a small disk (a real tmpfs): the WAL never takes the space the data needs, a full disk is reported
as such, and writes resume by themselves once space is freed."""

from __future__ import annotations

import pytest
from sqlalchemy import func, select, text

from trimtab.contract.sink import SinkUnavailable
from trimtab.store.sink import StoreSink
from trimtab.store.models import gpu_samples
from tests.store.conftest import T0_MS, make_batch
from tests.support.tmpfs import fill

MiB = 1024 * 1024


def write_until_full(sink: StoreSink, start: int, limit: int = 5000) -> tuple[int, str]:
    """Batches of 8 GPUs × 10 s until the store refuses one: (batches written, the refusal's message)."""
    for i in range(start, start + limit):
        try:
            sink.write(make_batch([T0_MS + 1000 * (10 * i + j) for j in range(10)], n_gpus=8))
        except SinkUnavailable as exc:
            return i - start, str(exc)
    pytest.fail(f"{limit} batches fit: the disk was not small")


def test_a_full_disk_is_filled_with_data_not_with_wal_and_the_store_recovers(small_disk):
    disk = small_disk(16 * MiB)
    filler = fill(disk, leave_bytes=6 * MiB)  # the store gets 6 MiB of a disk that is mostly taken
    sink = StoreSink(f"sqlite:///{disk}/trimtab.db")
    written, why = write_until_full(sink, 0)
    wal = (disk / "trimtab.db-wal").stat().st_size
    assert "disk of the store" in why and "is full" in why and "bytes free" in why, why
    assert wal < 2 * MiB, f"the WAL ({wal} bytes) must not take the space of the data"
    assert (disk / "trimtab.db").stat().st_size > 2 * MiB

    filler.unlink()  # space again: the same sink, without a restart, writes on
    more, _ = write_until_full(sink, written)
    assert more > written, "freed space is used for data"
    with sink.engine.connect() as conn:
        assert conn.execute(text("PRAGMA integrity_check")).scalar_one() == "ok"
        stored = conn.execute(select(func.count()).select_from(gpu_samples)).scalar_one()
    assert stored == (written + more) * 10 * 8, "every acknowledged batch is there"
    sink.close()
