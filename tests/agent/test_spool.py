"""The spool keeps batches in order across restarts, stays within its bound, and says what it dropped."""

import json

from trimtab.contract.readings import Batch, GpuSample, NodeInfo, NvlinkSample
from trimtab.agent.spool import Spool


def batch(i: int, gpus: int = 2) -> Batch:
    return Batch(node=NodeInfo(hostname="n1"), gpu_samples=[GpuSample(gpu_uuid=f"GPU-{g}", ts_ms=i, util_pct=float(i)) for g in range(gpus)])


def drain(spool: Spool) -> list[int]:
    seen = []
    while True:
        items = spool.peek(limit=3)
        if not items:
            return seen
        for it in items:
            seen.append(it.batch.gpu_samples[0].ts_ms)
            spool.ack(it)


def test_batches_come_back_in_order_and_once(tmp_path):
    spool = Spool(tmp_path, segment_bytes=400)  # small segments: order must hold across files
    for i in range(20):
        assert spool.append(batch(i)) == []
    assert spool.stats()["batches"] == 20
    assert drain(spool) == list(range(20))
    assert spool.is_empty()
    assert drain(spool) == []


def test_a_restart_resumes_after_the_last_acknowledged_batch(tmp_path):
    spool = Spool(tmp_path, segment_bytes=400)
    for i in range(10):
        spool.append(batch(i))
    acked = 0
    while acked < 4:
        it = spool.peek(limit=1)[0]
        spool.ack(it)
        acked += 1
    reopened = Spool(tmp_path, segment_bytes=400)
    assert drain(reopened) == list(range(4, 10))


def test_overflow_drops_oldest_whole_segments_and_reports_the_rows(tmp_path):
    spool = Spool(tmp_path, max_bytes=3000, segment_bytes=600)
    dropped = []
    for i in range(60):
        dropped += spool.append(batch(i))
    assert dropped, "a 3 kB spool cannot hold 60 batches"
    assert spool.pending_bytes() <= 3000
    lost = sum(d.batches for d in dropped)
    kept = drain(spool)
    assert lost + len(kept) == 60
    assert sum(d.rows for d in dropped) == 2 * lost
    assert kept == list(range(60 - len(kept), 60)), "what survives is the newest data, in order"


def test_a_torn_last_line_from_a_crash_is_cut_and_counted(tmp_path):
    spool = Spool(tmp_path)
    for i in range(3):
        spool.append(batch(i))
    seg = sorted(tmp_path.glob("*.jsonl"))[-1]
    with seg.open("ab") as f:
        f.write(b'{"node": {"hostname": "n1"}, "gpu_sam')  # the crash
    reopened = Spool(tmp_path)
    assert reopened.corrupt_lines_skipped == 1
    reopened.append(batch(3))
    assert drain(reopened) == [0, 1, 2, 3]


def test_an_unreadable_line_is_skipped_loudly_not_fatally(tmp_path):
    spool = Spool(tmp_path)
    spool.append(batch(0))
    seg = sorted(tmp_path.glob("*.jsonl"))[-1]
    with seg.open("ab") as f:
        f.write(b"not json at all\n")
    spool.append(batch(1))
    assert drain(spool) == [0, 1]
    assert spool.corrupt_lines_skipped == 1


def test_per_link_nvlink_survives_the_spool_and_a_spooled_batch_from_before_it_still_reads(tmp_path):
    spool = Spool(tmp_path)
    with_links = batch(1)
    with_links.nvlink_samples = [NvlinkSample("GPU-0", 1, link, tx_bytes_per_s=1e9 * link, rx_bytes_per_s=None)
                                 for link in range(3)]
    spool.append(with_links)
    item = spool.peek(limit=1)[0]
    assert item.batch == with_links and item.batch.row_count() == 2 + 3
    older = json.loads(batch(2).to_json())
    del older["nvlink_samples"]  # what an agent from before per-link NVLink spooled
    assert Batch.from_dict(older).nvlink_samples == []
