"""A server's latest readings (``/v1/gpus``, ``/metrics``) follow the newest sample as more arrive, read from the
store's latest rows for agents that write to it directly (issue 39)."""

from __future__ import annotations

import re
from dataclasses import replace

from trimtab.store.ingest import BatchWriter
from tests.api.conftest import recent_batch


def scraped_timestamps(text: str) -> dict[str, float]:
    """GPU uuid → trimtab_gpu_sample_timestamp_seconds of one exposition."""
    found = re.findall(r'^trimtab_gpu_sample_timestamp_seconds\{[^}]*UUID="([^"]+)"[^}]*\} (\S+)$', text, re.M)
    return {uuid: float(value) for uuid, value in found}


def test_a_servers_latest_readings_follow_the_newest_sample_not_a_late_one(api):
    server = api.ctx
    server.mode = "server"
    writer = BatchWriter(server.engine)
    batch = recent_batch(seconds=6)
    samples, newest_ms = batch.gpu_samples, batch.gpu_samples[-1].ts_ms
    batch.gpu_samples = [s for s in samples if s.ts_ms >= newest_ms - 1000]
    writer.write(batch)
    batch.gpu_samples = [s for s in samples if s.ts_ms < newest_ms - 1000]  # late: new rows, older than the newest
    writer.write(batch)
    seen = []
    for round_ in range(3):
        newer = recent_batch(seconds=1, util_pct=lambda i, _t, r=round_: 70.0 + r + i)
        newer.gpu_samples = [replace(s, ts_ms=newest_ms + 1000 * (round_ + 1)) for s in newer.gpu_samples]
        writer.write(newer)
        gpus = api.get("/v1/gpus").json()["gpus"]
        seen.append(sorted((g["uuid"], g["latest"]["ts_ms"], g["latest"]["metrics"]["util_pct"]) for g in gpus))
        stamps = scraped_timestamps(api.get("/metrics").text)
        assert stamps == {g["uuid"]: (newest_ms + 1000 * (round_ + 1)) / 1000 for g in gpus}, stamps
    writer.close()
    uuids = sorted({u for u, _, _ in seen[0]})
    assert seen == [[(u, newest_ms + 1000 * (r + 1), 70.0 + r + i) for i, u in enumerate(uuids)] for r in range(3)]
