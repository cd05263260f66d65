"""The ways to read per-process utilization (trimtab.agent.nvml.procutil), through the real pynvml bindings over
bench/_nvml_standin.py's no-cost libnvidia-ml (no GPU here: the stand-in answers two records, a stub of the driver):
one C call gives the wrapper's records, grows its buffer when NVML says it is too small, and turns a failing return
code into NVMLError as the wrapper does."""

from __future__ import annotations

import ctypes

import pytest

from bench import _nvml_standin as standin
from trimtab.agent.nvml import procutil

pynvml = pytest.importorskip("pynvml")


@pytest.fixture
def nv():
    """The real bindings over the stand-in (put back afterwards: other tests use the bindings' types)."""
    saved = pynvml.nvmlLib
    standin.install_no_cost_nvml(pynvml, 1)
    yield pynvml
    pynvml.nvmlLib = saved
    pynvml._nvmlGetFunctionPointer_cache.clear()


def fields(records) -> list[tuple]:
    return [(r.pid, r.timeStamp, r.smUtil, r.memUtil) for r in records]


@pytest.mark.parametrize("function", procutil.ACTIVITY_CALLS)
def test_one_c_call_gives_the_wrappers_records(nv, function):
    handle = ctypes.c_void_p(1)
    one = procutil.OneCall(nv, function)
    wrapped = getattr(nv, function)(handle, 0)
    got = one(handle, 0)
    assert fields(got) == fields(wrapped) and len(got) == standin.FAKE_ACTIVITY_RECORDS
    assert {w.label for w in procutil.candidates(nv)} == {f + s for f in procutil.ACTIVITY_CALLS
                                                           for s in ("", procutil.ONE_CALL)}


@pytest.mark.parametrize("function", procutil.ACTIVITY_CALLS)
def test_a_buffer_too_small_grows_to_what_nvml_asks(nv, monkeypatch, function):
    monkeypatch.setattr(procutil, "_FIRST_CAPACITY", 1)
    one = procutil.OneCall(nv, function)
    assert len(one(ctypes.c_void_p(1), 0)) == standin.FAKE_ACTIVITY_RECORDS
    assert one.capacity == standin.FAKE_ACTIVITY_RECORDS


def test_a_failing_return_code_raises_nvml_error(nv, monkeypatch):
    one = procutil.OneCall(nv, procutil.NEW)
    monkeypatch.setattr(one, "_fn", lambda *_: nv.NVML_ERROR_NOT_FOUND)
    with pytest.raises(nv.NVMLError) as raised:
        one(ctypes.c_void_p(1), 123)
    assert raised.value.value == nv.NVML_ERROR_NOT_FOUND
