"""/metrics speaks dcgm-exporter where DCGM has the field (its current generation by default, the legacy one behind
``metrics_dcgm_names``), trimtab_* in base units elsewhere, leaves unsupported metrics out rather than reporting 0,
marks simulated data, and survives a broken store."""

import logging
import time

import pytest

from trimtab.contract.readings import GPU_METRIC_NAMES, Batch, GpuInfo, GpuSample, NodeInfo
from trimtab.agent.sampler import Sampler
from trimtab.agent.simulated import SimulatedNode
from trimtab.api.metrics import DCGM_METRICS, render_metrics
from trimtab.api.metrics.gpus import dcgm_metrics

from .conftest import Feeder, by_uuid, scrape

MIB = 2**20
GPU_LABELS = {"gpu", "UUID", "modelName", "hostname"}  # dcgm-exporter >= 4.8.3: hostname, no Hostname
LEGACY_GPU_LABELS = GPU_LABELS | {"Hostname"}


def real_node_batch(ts_ms: int) -> Batch:
    """A real (not simulated) pre-Hopper PCIe GPU: no GPM, no NVLink, no driver-reserved memory reading."""
    uuid = "GPU-real-0"
    return Batch(
        node=NodeInfo(hostname="real-node", driver_version="550.54"),
        gpus=[GpuInfo(uuid=uuid, index=0, name="NVIDIA A100-PCIE-40GB", memory_total_bytes=40 * 2**30,
                      pcie_max_gen=4, pcie_max_width=16, pcie_peak_bytes_per_s=31.5e9, nvlink_link_count=None)],
        gpu_samples=[GpuSample(gpu_uuid=uuid, ts_ms=ts_ms, util_pct=37.0, mem_used_bytes=10 * 2**30,
                               mem_total_bytes=40 * 2**30, pcie_tx_bytes_per_s=3.15e9, power_w=120.5,
                               temperature_c=51.0, sm_clock_mhz=1410, clock_event_mask=0)],
    )


@pytest.mark.parametrize("generation", ["current", "legacy"])
def test_every_gpu_metric_has_a_dcgm_name(generation):
    metrics = dcgm_metrics(generation)
    assert sorted(d.field for d in metrics) == sorted(GPU_METRIC_NAMES)
    assert all(d.name.startswith(("DCGM_FI_DEV_", "DCGM_FI_PROF_")) for d in metrics)
    assert len({d.name for d in metrics}) == len(metrics)
    assert DCGM_METRICS == dcgm_metrics("current")  # the default


def test_an_unknown_generation_is_refused_with_the_choices():
    with pytest.raises(ValueError, match="choose one of current, legacy"):
        dcgm_metrics("newest")


# name → value from the GpuSample in that generation's unit (memory total: the simulated H100's 80 GiB)
CURRENT_UNITS = {
    "DCGM_FI_DEV_GPU_UTIL_RATIO": lambda s: s.util_pct / 100,  # ratio 0-1 since 4.9.0
    "DCGM_FI_PROF_SM_UTIL_RATIO": lambda s: s.sm_active_pct / 100,
    "DCGM_FI_PROF_SM_OCCUPANCY_RATIO": lambda s: s.sm_occupancy_pct / 100,
    "DCGM_FI_PROF_TENSOR_UTIL_RATIO": lambda s: s.tensor_active_pct / 100,
    "DCGM_FI_PROF_DRAM_UTIL_RATIO": lambda s: s.dram_bw_util_pct / 100,
    "DCGM_FI_DEV_FB_USED_BYTES": lambda s: s.mem_used_bytes,  # bytes since 4.9.0
    "DCGM_FI_DEV_FB_RESERVED_BYTES": lambda s: s.mem_reserved_bytes,
    "DCGM_FI_DEV_FB_CAPACITY_BYTES": lambda s: 80 * 2**30,
    "DCGM_FI_DEV_FB_FREE_BYTES": lambda s: s.mem_total_bytes - s.mem_used_bytes - s.mem_reserved_bytes,
    "DCGM_FI_PROF_PCIE_TX_BYTES_PER_SECOND": lambda s: s.pcie_tx_bytes_per_s,  # bytes/s, renamed in 4.10.0
    "DCGM_FI_PROF_PCIE_RX_BYTES_PER_SECOND": lambda s: s.pcie_rx_bytes_per_s,
    "DCGM_FI_PROF_NVLINK_TX_BYTES_PER_SECOND": lambda s: s.nvlink_tx_bytes_per_s,
    "DCGM_FI_PROF_NVLINK_RX_BYTES_PER_SECOND": lambda s: s.nvlink_rx_bytes_per_s,
    "DCGM_FI_DEV_BOARD_POWER_WATTS": lambda s: s.power_w,
    "DCGM_FI_DEV_GPU_TEMP_CELSIUS": lambda s: s.temperature_c,
    "DCGM_FI_DEV_SM_CLOCK_HERTZ": lambda s: s.sm_clock_mhz * 1e6,  # Hz since 4.9.0
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": lambda s: s.clock_event_mask,
}
LEGACY_UNITS = {
    "DCGM_FI_DEV_GPU_UTIL": lambda s: s.util_pct,  # percent
    "DCGM_FI_PROF_SM_ACTIVE": lambda s: s.sm_active_pct / 100,  # ratios 0-1
    "DCGM_FI_PROF_SM_OCCUPANCY": lambda s: s.sm_occupancy_pct / 100,
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": lambda s: s.tensor_active_pct / 100,
    "DCGM_FI_PROF_DRAM_ACTIVE": lambda s: s.dram_bw_util_pct / 100,
    "DCGM_FI_DEV_FB_USED": lambda s: s.mem_used_bytes / MIB,  # MiB
    "DCGM_FI_DEV_FB_RESERVED": lambda s: s.mem_reserved_bytes / MIB,
    "DCGM_FI_DEV_FB_TOTAL": lambda s: 80 * 1024,
    "DCGM_FI_DEV_FB_FREE": lambda s: (s.mem_total_bytes - s.mem_used_bytes - s.mem_reserved_bytes) / MIB,
    "DCGM_FI_PROF_PCIE_TX_BYTES": lambda s: s.pcie_tx_bytes_per_s,  # bytes/s
    "DCGM_FI_PROF_PCIE_RX_BYTES": lambda s: s.pcie_rx_bytes_per_s,
    "DCGM_FI_PROF_NVLINK_TX_BYTES": lambda s: s.nvlink_tx_bytes_per_s,
    "DCGM_FI_PROF_NVLINK_RX_BYTES": lambda s: s.nvlink_rx_bytes_per_s,
    "DCGM_FI_DEV_POWER_USAGE": lambda s: s.power_w,
    "DCGM_FI_DEV_GPU_TEMP": lambda s: s.temperature_c,
    "DCGM_FI_DEV_SM_CLOCK": lambda s: s.sm_clock_mhz,  # MHz
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": lambda s: s.clock_event_mask,
}
GENERATIONS = {"current": (CURRENT_UNITS, GPU_LABELS, "DCGM_FI_DEV_GPU_UTIL_RATIO", "DCGM_FI_PROF_SM_UTIL_RATIO"),
               "legacy": (LEGACY_UNITS, LEGACY_GPU_LABELS, "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_PROF_SM_ACTIVE")}


@pytest.mark.parametrize("generation", sorted(GENERATIONS))
def test_dcgm_names_labels_and_units_match_the_latest_sample(ctx, feed: Feeder, generation):
    units, labels_of_gpu, util, sm = GENERATIONS[generation]
    ctx.metrics_dcgm_names = generation
    batch = feed.simulated(hostname="sim-a")
    got = scrape(ctx)
    info = {g.uuid: g for g in batch.gpus}
    samples = {s.gpu_uuid: s for s in batch.gpu_samples}
    assert len(samples) == 4

    for labels, _ in got[util]:
        g = info[labels["UUID"]]
        assert labels == {"gpu": str(g.index), "UUID": g.uuid, "modelName": g.name, "simulated": "true",
                          **{name: "sim-a" for name in labels_of_gpu - {"gpu", "UUID", "modelName"}}}

    other = CURRENT_UNITS if generation == "legacy" else LEGACY_UNITS
    assert not set(other) & set(got), "the other generation's names leaked in"
    expected = {**units,
        "trimtab_gpu_pcie_tx_ratio_of_peak": lambda s: s.pcie_tx_bytes_per_s / info[s.gpu_uuid].pcie_peak_bytes_per_s,
        "trimtab_gpu_pcie_rx_ratio_of_peak": lambda s: s.pcie_rx_bytes_per_s / info[s.gpu_uuid].pcie_peak_bytes_per_s,
        "trimtab_gpu_pcie_peak_bytes_per_second": lambda s: info[s.gpu_uuid].pcie_peak_bytes_per_s,
        "trimtab_gpu_nvlink_links": lambda s: 18,
        "trimtab_gpu_sample_timestamp_seconds": lambda s: s.ts_ms / 1000,
    }
    for name, value_of in expected.items():
        assert by_uuid(got[name]) == {u: pytest.approx(value_of(s), rel=1e-12) for u, s in samples.items()}, name
        assert all(set(labels) == labels_of_gpu | {"simulated"} for labels, _ in got[name]), name
    ratios = [v for name in (sm, "trimtab_gpu_pcie_tx_ratio_of_peak") for _, v in got[name]]
    assert all(0 <= v <= 1 for v in ratios)
    assert got["trimtab_node_simulated"] == [({"hostname": "sim-a"}, 1.0)]


def test_help_text_says_what_the_number_means_and_its_unit(ctx, feed: Feeder):
    feed.simulated()
    text = render_metrics(ctx).decode()
    assert "# HELP DCGM_FI_PROF_SM_UTIL_RATIO GPM SM activity: share of SMs busy" in text
    assert "# TYPE DCGM_FI_DEV_FB_USED_BYTES gauge" in text
    assert "Unit: ratio 0-1, as DCGM." in text.split("# HELP DCGM_FI_DEV_GPU_UTIL_RATIO ")[1].splitlines()[0]
    helps = [line for line in text.splitlines() if line.startswith("# HELP ")]
    assert all(len(line.split(" ", 3)[3]) > 20 for line in helps), helps
    assert all("Unit: " in line for line in helps if line.startswith("# HELP DCGM_")), helps


def test_unsupported_metrics_are_absent_not_zero(ctx, feed: Feeder):
    sim = feed.simulated(hostname="sim-a", n_gpus=2, ticks=1)
    no_nvlink = sim.gpu_samples[1]
    no_nvlink.ts_ms += 1  # a newer sample of GPU 1 that lost its NVLink readings
    no_nvlink.nvlink_tx_bytes_per_s = no_nvlink.nvlink_rx_bytes_per_s = None
    feed(Batch(node=sim.node, gpus=sim.gpus, gpu_samples=[no_nvlink]))
    feed(real_node_batch(int(time.time() * 1000)))
    got = scrape(ctx)

    nvlink_uuids = (set(by_uuid(got["DCGM_FI_PROF_NVLINK_TX_BYTES_PER_SECOND"]))
                    | set(by_uuid(got["DCGM_FI_PROF_NVLINK_RX_BYTES_PER_SECOND"])))
    assert nvlink_uuids == {sim.gpu_samples[0].gpu_uuid}
    assert set(by_uuid(got["trimtab_gpu_nvlink_links"])) == {g.uuid for g in sim.gpus}  # links are inventory
    for name in ("DCGM_FI_PROF_SM_UTIL_RATIO", "DCGM_FI_PROF_SM_OCCUPANCY_RATIO", "DCGM_FI_PROF_TENSOR_UTIL_RATIO",
                 "DCGM_FI_PROF_DRAM_UTIL_RATIO", "DCGM_FI_DEV_FB_RESERVED_BYTES",
                 "DCGM_FI_PROF_PCIE_RX_BYTES_PER_SECOND",
                 "trimtab_gpu_pcie_rx_ratio_of_peak", "trimtab_gpu_nvlink_links"):
        assert "GPU-real-0" not in by_uuid(got[name]), name
    real = {name: by_uuid(samples)["GPU-real-0"] for name, samples in got.items()
            if any(labels.get("UUID") == "GPU-real-0" for labels, _ in samples)}
    assert real["DCGM_FI_DEV_GPU_UTIL_RATIO"] == 0.37
    assert real["DCGM_FI_DEV_FB_FREE_BYTES"] == 30 * 2**30  # no reserved reading: free = total - used
    assert real["trimtab_gpu_pcie_tx_ratio_of_peak"] == pytest.approx(0.1)
    assert real["DCGM_FI_DEV_CLOCKS_EVENT_REASONS"] == 0  # a real 0 (no reason) is kept


def without_empty(labels: dict) -> dict:
    """The labels as Prometheus stores them: a label with an empty value is no label at all."""
    return {k: v for k, v in labels.items() if v != ""}


def test_simulated_data_is_marked_and_real_data_keeps_the_dcgm_label_set(ctx, feed: Feeder):
    feed.simulated(hostname="sim-a", ticks=1)
    feed(real_node_batch(int(time.time() * 1000)))
    got = scrape(ctx)
    assert sorted(got["trimtab_node_simulated"], key=lambda s: s[0]["hostname"]) == [
        ({"hostname": "real-node"}, 0.0), ({"hostname": "sim-a"}, 1.0)]
    for name, samples in got.items():
        for labels, _ in samples:
            if labels.get("hostname") == "real-node":
                assert "simulated" not in without_empty(labels), name
            elif labels.get("hostname") == "sim-a" and name != "trimtab_node_simulated":
                assert labels["simulated"] == "true", name
    real_labels = [labels for labels, _ in got["DCGM_FI_DEV_GPU_UTIL_RATIO"] if labels["hostname"] == "real-node"]
    assert [without_empty(labels) for labels in real_labels] == [
        {"gpu": "0", "UUID": "GPU-real-0", "modelName": "NVIDIA A100-PCIE-40GB", "hostname": "real-node"}]


def test_every_sample_of_a_family_has_the_same_label_names(ctx, feed: Feeder):
    """simulated on every sample of a family or on none: a real node's samples beside simulated ones say
    simulated="" (no label, to Prometheus); a family of real nodes only has no simulated label at all."""
    feed.simulated(hostname="sim-a", ticks=1)
    feed(real_node_batch(int(time.time() * 1000)))
    for name, samples in scrape(ctx).items():
        assert len({frozenset(labels) for labels, _ in samples}) == 1, name

    real_only = Feeder(ctx.__class__(engine=ctx.engine, mode=ctx.mode, state_dir=ctx.state_dir), store=False)
    real_only(real_node_batch(int(time.time() * 1000)))
    got = scrape(real_only.ctx)
    assert got["DCGM_FI_DEV_GPU_UTIL_RATIO"] == [({"gpu": "0", "UUID": "GPU-real-0",
                                                   "modelName": "NVIDIA A100-PCIE-40GB", "hostname": "real-node"}, 0.37)]
    real_only.ctx.metrics_dcgm_names = "legacy"
    assert scrape(real_only.ctx)["DCGM_FI_DEV_GPU_UTIL"] == [
        ({"gpu": "0", "UUID": "GPU-real-0", "modelName": "NVIDIA A100-PCIE-40GB", "Hostname": "real-node",
          "hostname": "real-node"}, 37.0)]


def test_balance_verdicts_of_the_actor_hot_scenario(ctx, feed: Feeder):
    feed.simulated(hostname="sim-a", scenario="actor-hot", ticks=5)
    got = scrape(ctx)
    status = {labels["check"]: v for labels, v in got["trimtab_balance_status"]}
    value = {labels["check"]: v for labels, v in got["trimtab_balance_value"]}
    assert status == {"utilization_spread": 2, "pcie": 0, "memory": 0,
                      "step_composition": 0, "fragmentation": 0, "collective_latency": 0}
    assert value["utilization_spread"] > 40  # points: actor GPUs ~90 % vs critic < 30 %
    assert 0 < value["pcie"] < 70 and 0 < value["memory"] < 100  # percent
    assert set(value) == {"utilization_spread", "pcie", "memory"}  # job checks have no data: no value series
    assert all(labels["hostname"] == "sim-a" and labels["simulated"] == "true"
               for labels, _ in got["trimtab_balance_status"])


def test_a_balanced_node_grades_ok(ctx, feed: Feeder):
    feed.simulated(scenario="balanced", ticks=5)
    status = {labels["check"]: v for labels, v in scrape(ctx)["trimtab_balance_status"]}
    assert set(status.values()) == {0}


def test_a_broken_store_drops_only_the_balance_series(make_ctx, caplog):
    scrape(make_ctx())  # a healthy scrape first: whatever failed before in this process is over
    ctx = make_ctx(migrated=False)  # every store query fails: the store has no tables
    Feeder(ctx, store=False).simulated(hostname="sim-a", n_gpus=2, ticks=1)
    with caplog.at_level(logging.WARNING, logger="trimtab.api.metrics"):
        first, second = scrape(ctx), scrape(ctx)
    assert len(second["DCGM_FI_DEV_GPU_UTIL_RATIO"]) == 2  # GPU series still come from memory
    assert not any(name.startswith("trimtab_balance_") for name in second)
    before = {labels["part"]: v for labels, v in first["trimtab_scrape_errors_total"]}
    after = {labels["part"]: v for labels, v in second["trimtab_scrape_errors_total"]}
    assert after == {"balance": before["balance"] + 1, "gpus": before["gpus"]}
    warnings = [r for r in caplog.records if "balance series left out" in r.getMessage()]
    assert len(warnings) == 1  # once per outage, not once per scrape


def test_server_mode_shows_gpus_that_only_the_store_holds(make_ctx):
    ctx = make_ctx(mode="server")
    last = Feeder(ctx, snapshot=False).simulated(hostname="direct", scenario="balanced", n_gpus=2, ticks=2)
    got = scrape(ctx)
    assert by_uuid(got["DCGM_FI_DEV_GPU_UTIL_RATIO"]) == {s.gpu_uuid: s.util_pct / 100 for s in last.gpu_samples}
    assert all(labels["simulated"] == "true" for labels, _ in got["DCGM_FI_DEV_GPU_UTIL_RATIO"])


def test_an_empty_daemon_exposes_only_its_error_counter(ctx):
    got = scrape(ctx)
    assert set(got) == {"trimtab_scrape_errors_total"}
    assert {labels["part"] for labels, _ in got["trimtab_scrape_errors_total"]} == {"gpus", "balance"}


def test_per_link_nvlink_of_the_simulated_node_goes_agent_store_metrics_with_a_link_label(make_ctx):
    from sqlalchemy import select

    from trimtab.store.models import gpu_nvlink_samples, gpus
    from trimtab.store.queries import latest_nvlink_samples

    for mode, feeder in (("up", lambda c: Feeder(c)), ("server", lambda c: Feeder(c, snapshot=False))):
        ctx = make_ctx(mode=mode)
        feed = feeder(ctx)
        sampler = Sampler([SimulatedNode(2, "actor-hot", hostname="sim-a")], feed, hostname="sim-a")
        tick0, *later = [sampler.tick() for _ in range(3)]  # tick 0 carries every link, ticks 1 and 2 none
        assert len(tick0.nvlink_samples) == 2 * 18 and not any(b.nvlink_samples for b in later)
        feed(real_node_batch(int(time.time() * 1000)))  # a GPU without NVLink: no per-link series at all
        got = scrape(ctx, nvlink_links=True)

        tx = got["trimtab_gpu_nvlink_link_tx_bytes_per_second"]
        rx = got["trimtab_gpu_nvlink_link_rx_bytes_per_second"]
        assert len(tx) == len(rx) == 2 * 18, mode
        assert {labels["UUID"] for labels, _ in tx} == {g.uuid for g in tick0.gpus}, mode
        assert {labels["link"] for labels, _ in tx} == {str(link) for link in range(18)}, mode
        assert all(set(labels) == GPU_LABELS | {"link", "simulated"} and labels["simulated"] == "true"
                   for labels, _ in tx + rx), mode
        for gpu in tick0.gpu_samples:  # the links of a GPU add up to its NVLink total of that tick
            assert sum(v for labels, v in tx if labels["UUID"] == gpu.gpu_uuid) == pytest.approx(
                gpu.nvlink_tx_bytes_per_s), mode
            assert sum(v for labels, v in rx if labels["UUID"] == gpu.gpu_uuid) == pytest.approx(
                gpu.nvlink_rx_bytes_per_s), mode
        stamped = {v for _, v in got["trimtab_gpu_nvlink_link_timestamp_seconds"]}
        assert stamped == {tick0.gpu_samples[0].ts_ms / 1000}, mode  # read on tick 0, not since
        assert "GPU-real-0" not in {labels["UUID"] for name in ("trimtab_gpu_nvlink_link_tx_bytes_per_second",
                                                                "trimtab_gpu_nvlink_link_timestamp_seconds")
                                    for labels, _ in got[name]}, mode
        with ctx.engine.connect() as conn:
            stored = conn.execute(select(gpus.c.uuid, gpu_nvlink_samples.c.link).join(gpus)).all()
        assert len(stored) == 2 * 18 and "GPU-real-0" not in {uuid for uuid, _ in stored}, mode
        assert {r.gpu_uuid for r in latest_nvlink_samples(ctx.engine)} == {g.uuid for g in tick0.gpus}, mode
