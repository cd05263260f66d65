"""The arithmetic of ``bench/multigpu_nvlink.py`` that decides whether the agent's NVLink figures agree with the
load: ring all-reduce accounting, which GPU sends and receives what, phase windows against the 1 s tick, rates
from byte marks, the % difference and the table. No CUDA: the bench itself needs a multi-GPU machine."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bench.nvlink_accounting import (ROW_HEADER, Stream, costs_in, covered_span, expected_rates, markdown, pct_diff,
                                     peer_ring_pairs, phase_rows, plan_text, rate_in_window,
                                     ring_allreduce_bytes_per_rank, sample_window, tick_cost_per_gpu_us, verdict)

REPO = Path(__file__).resolve().parents[2]
MiB = 1 << 20


@pytest.mark.parametrize("world, factor", [(1, 0.0), (2, 1.0), (4, 1.5), (8, 1.75)])
def test_ring_allreduce_sends_two_n_minus_one_over_n_of_the_buffer_per_rank(world, factor):
    assert ring_allreduce_bytes_per_rank(256 * MiB, world) == pytest.approx(factor * 256 * MiB)
    with pytest.raises(ValueError):
        ring_allreduce_bytes_per_rank(1, 0)


def test_peer_pairs_form_a_ring_over_the_chosen_gpus():
    assert peer_ring_pairs([0, 1, 2, 3]) == [(0, 1), (1, 2), (2, 3), (3, 0)]
    assert peer_ring_pairs([0, 1]) == [(0, 1), (1, 0)]
    assert peer_ring_pairs([2, 5, 7]) == [(2, 5), (5, 7), (7, 2)]
    assert peer_ring_pairs([3]) == []


def test_rate_in_window_uses_only_marks_inside_it():
    marks = [(100.0 + t, t * 1e9) for t in range(11)]          # 1 GB/s for 10 s
    assert rate_in_window(marks, 101.5, 108.5) == pytest.approx(1e9)
    uneven = [(0.0, 0), (1.0, 5e9), (2.0, 6e9), (3.0, 7e9)]    # a burst before the window does not count
    assert rate_in_window(uneven, 1.0, 3.0) == pytest.approx(1e9)
    assert rate_in_window(marks, 150.0, 160.0) is None
    assert rate_in_window([(1.0, 0)], 0.0, 2.0) is None


def test_sample_window_skips_the_first_tick_and_the_edges():
    assert sample_window(1000.0, 1010.0, 1.0) == (1001500, 1009500)
    assert sample_window(1000.0, 1002.0, 1.0) is None           # no sample lies wholly inside
    assert covered_span((1001500, 1009500), 1.0) == (1000.5, 1009.5)


def _steady(link, tx, rx, rate, t0=0.0, seconds=10):
    return Stream(link, tx, rx, [(t0 + s, s * rate) for s in range(seconds + 1)])


def test_expected_rates_attribute_each_copy_to_its_sender_and_receiver():
    pairs = peer_ring_pairs([0, 1, 2, 3])
    streams = [_steady("nvlink", s, d, (k + 1) * 1e9) for k, (s, d) in enumerate(pairs)]
    got = expected_rates(streams, (1.0, 9.0))
    for k, (s, d) in enumerate(pairs):
        assert got[("nvlink", "tx", s)] == pytest.approx((k + 1) * 1e9)
        assert got[("nvlink", "rx", d)] == pytest.approx((k + 1) * 1e9)
    assert got[("nvlink", "rx", 0)] == pytest.approx(4e9)        # from GPU 3


def test_all_reduce_ranks_send_and_receive_the_same_and_h2d_is_pcie_rx_only():
    per_op = ring_allreduce_bytes_per_rank(256 * MiB, 4)
    ranks = [Stream("nvlink", g, g, [(t * 0.01, t * per_op) for t in range(1001)]) for g in range(4)]
    h2d = [_steady("pcie", None, g, 20e9) for g in range(4)]
    got = expected_rates(ranks + h2d, (1.0, 9.0))
    for g in range(4):
        assert got[("nvlink", "tx", g)] == got[("nvlink", "rx", g)] == pytest.approx(per_op * 100)
        assert got[("pcie", "rx", g)] == pytest.approx(20e9)
        assert ("pcie", "tx", g) not in got


def test_pct_difference_and_the_five_percent_goal():
    assert pct_diff(105.0, 100.0) == pytest.approx(5.0)
    assert pct_diff(90.0, 100.0) == pytest.approx(-10.0)
    assert pct_diff(None, 100.0) is None and pct_diff(1.0, 0.0) is None and pct_diff(1.0, None) is None
    assert verdict(4.9) == "ok" and verdict(-5.0) == "ok" and verdict(5.1) == "OFF" and verdict(None) == ""


def test_tick_cost_per_gpu_counts_each_tick_once():
    polls = [(1.0, 10, 0.002), (1.5, 10, 0.002), (2.0, 11, 0.004), (2.5, 12, 0.003), (9.0, 13, 0.1)]
    costs = costs_in(polls, 0.0, 3.0)
    assert sorted(costs) == [0.002, 0.003, 0.004]
    assert tick_cost_per_gpu_us(costs, 4) == pytest.approx(750.0)
    assert tick_cost_per_gpu_us([], 4) is None


def test_table_rows_show_agreement_unsupported_and_missing_data():
    expected = {("nvlink", "tx", 0): 100e9, ("nvlink", "rx", 0): 100e9, ("pcie", "rx", 1): 50e9}
    agent = {0: {"n": 8, "nvlink_tx_bytes_per_s": 103e9, "nvlink_rx_bytes_per_s": 90e9, "pcie_tx_bytes_per_s": 1e8,
                 "pcie_rx_bytes_per_s": 2e8, "util_pct": 99.0},
             1: {"n": 8, "nvlink_tx_bytes_per_s": None, "nvlink_rx_bytes_per_s": None,
                 "pcie_rx_bytes_per_s": 55e9, "util_pct": 100.0}}
    rows = phase_rows("peer", [0, 1, 2], agent, expected, {0: (101e9, 99e9)}, 612.4)
    assert len(rows) == 3 and all(len(r) == len(ROW_HEADER) for r in rows)
    r0, r1, r2 = (dict(zip(ROW_HEADER, r)) for r in rows)
    assert r0["agent NVLink TX"] == "103.00" and r0["load TX"] == "100.00" and r0["Δ TX %"] == "+3.0 ok"
    assert r0["Δ RX %"] == "-10.0 OFF" and r0["NVML data TX/RX"] == "101.00 / 99.00" and r0["tick µs/GPU"] == "612"
    assert r1["agent NVLink TX"] == "unsupported" and r1["Δ PCIe RX %"] == "+10.0"
    assert r2["n"] == "0" and r2["agent NVLink TX"] == "-"
    text = markdown(ROW_HEADER, rows)
    assert text.splitlines()[0].startswith("| phase | GPU |") and len(text.splitlines()) == 5


def test_plan_and_dry_run_need_no_cuda():
    text = plan_text([0, 1], ["peer", "allreduce", "idle"], 10.0, 256, 256, 256, "Ring", "Simple")
    assert "NCCL_NVLS_ENABLE=0" in text and "[(0, 1), (1, 0)]" in text and "256 MiB sent" in text
    out = subprocess.run([sys.executable, "bench/multigpu_nvlink.py", "--dry-run", "--gpus", "0,1,2,3"], cwd=REPO,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "384 MiB sent and received per rank" in out.stdout and "8 samples per GPU" in out.stdout
