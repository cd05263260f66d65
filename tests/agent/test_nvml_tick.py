"""The tick's hot path: struct fields read in one C call agree with attribute reads (and fall back to them where a
layout cannot be read so), the sample built from a prepared dict is the dataclass's own, and a GPM value that is
not a finite number reads as None."""

from __future__ import annotations

import ctypes
import math

import pytest

from tests.agent import fake_pynvml as fk
from trimtab.agent.nvml import gpm as nvml_gpm
from trimtab.agent.nvml.structs import field_reader
from trimtab.contract.readings import GpuSample

nv = fk._real


def test_the_struct_readers_read_what_attribute_reads_read():
    memory = nv.c_nvmlMemory_v2_t()
    memory.total, memory.reserved, memory.free, memory.used = 80 << 30, 616 << 20, 1 << 30, (79 << 30) - (616 << 20)
    read = field_reader(nv.c_nvmlMemory_v2_t, ("total", "reserved", "used"))
    assert read(memory) == (memory.total, memory.reserved, memory.used)
    assert not isinstance(read, type(lambda: 0))  # the struct.Struct path, not the attribute fallback

    request = nv.c_nvmlGpmMetricsGet_t()
    for i in range(8):
        request.metrics[i].nvmlReturn, request.metrics[i].value = i % 3, 1.5 * i
    read = field_reader(nv.c_nvmlGpmMetric_t, ("nvmlReturn", "value"), offset=nv.c_nvmlGpmMetricsGet_t.metrics.offset,
                        count=8, stride=ctypes.sizeof(nv.c_nvmlGpmMetric_t))
    metrics = [request.metrics[i] for i in range(8)]
    assert read(request) == tuple(x for m in metrics for x in (m.nvmlReturn, m.value))


def test_a_layout_the_unpacker_cannot_read_falls_back_to_attribute_reads():
    class Nested(ctypes.Structure):
        _fields_ = [("a", ctypes.c_uint), ("info", nv.c_metricInfo_t), ("b", ctypes.c_double)]

    item = Nested(a=7, b=2.5)
    read = field_reader(Nested, ("a", "info", "b"))  # "info" is a struct, not a number
    a, info, b = read(item)
    assert (a, b) == (7, 2.5) and isinstance(info, nv.c_metricInfo_t)


def test_the_tick_builds_the_same_sample_the_dataclass_builds(install):
    source = install(fk.FakeNvml(n_gpus=1))
    sample = source.sample(123).gpu_samples[0]
    expected = GpuSample(gpu_uuid="GPU-fake-0", ts_ms=123, util_pct=50.0, mem_used_bytes=10 << 30,
                         mem_reserved_bytes=1 << 29, mem_total_bytes=80 << 30, power_w=150.0, temperature_c=40.0,
                         sm_clock_mhz=1500, clock_event_mask=0)
    assert type(sample) is GpuSample and sample == expected
    assert list(vars(sample)) == list(vars(expected))  # every field, in the dataclass's order


def test_a_gpm_value_that_is_not_finite_reads_none(install, monkeypatch):
    monkeypatch.setattr(nvml_gpm, "GPM_MIN_INTERVAL_S", -1.0)
    fake = fk.FakeNvml(n_gpus=1, gpm=True)
    real_get = fake.nvmlGpmMetricsGet

    def with_a_nan(request):
        real_get(request)
        request.metrics[0].value = math.nan  # SM activity
        return request

    fake.module.nvmlGpmMetricsGet = fake._counted("nvmlGpmMetricsGet", with_a_nan)
    source = install(fake)
    source.sample(1)
    s = source.sample(2).gpu_samples[0]
    assert s.sm_active_pct is None and s.tensor_active_pct == pytest.approx(42.0)
