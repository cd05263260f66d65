"""The hook's GPU time per phase (issue 22), on CPU: without CUDA nothing changes (a report goes at once, with no
GPU time, graded on wall time as before); with CUDA a report waits for its step's CUDA events — resolved with
``query()`` only, never a sync — and then carries each phase's GPU time.

CUDA is stubbed where a GPU is needed (``torch.cuda.Event`` and "CUDA in use"): a fake stream whose events complete
when the test says, so the holding logic is tested here; tests/trainer/test_gpu_phases_gpu.py runs the real thing
on the H200."""

from __future__ import annotations

import time

import pytest
import torch

import trimtab.trainer.timing as timing
from trimtab.trainer import attach
from trimtab.trainer.outbox import GPU_WAIT_STEPS


class Sent:
    """Stands in for the reporter: what the hook submitted, in order."""

    def __init__(self):
        self.bodies: list[dict] = []

    def submit(self, body: dict) -> None:
        self.bodies.append(body)

    def close(self, timeout_s: float) -> None:
        pass

    @property
    def steps(self) -> list[int]:
        return [b["step"] for b in self.bodies]


def hook_with(sent: Sent, **kw):
    hook = attach(job="gpu-time", server=None, **kw)
    hook._reporter = sent
    return hook


def test_without_cuda_a_report_goes_at_once_without_gpu_time():
    assert not timing.cuda_in_use()  # this machine: no CUDA in use
    sent = Sent()
    hook = hook_with(sent)
    for step in range(3):
        with hook.phase("generation"):
            time.sleep(0.002)
        with hook.phase("update"):
            pass
        hook.step_end(samples=4)
        assert sent.steps == list(range(step + 1))  # no step held back
    assert all("gpu_phases" not in b for b in sent.bodies)
    assert sent.bodies[0]["phases"]["generation"] >= 0.002
    hook.close()


class FakeGpu:
    """A stream's timeline: events are stamped with the GPU time at which they run; they complete once the
    test moves ``done_ms`` past them. ``syncs`` counts blocking waits (none may happen before close)."""

    def __init__(self):
        self.now_ms, self.done_ms, self.syncs = 0.0, 0.0, 0

    def event_class(self):
        gpu = self

        class Event:
            def __init__(self, enable_timing: bool = False):
                self.t_ms = None

            def record(self, stream=None):
                self.t_ms = gpu.now_ms

            def query(self) -> bool:
                return self.t_ms <= gpu.done_ms

            def elapsed_time(self, end) -> float:
                assert self.query() and end.query(), "elapsed_time on an unfinished event would block"
                return end.t_ms - self.t_ms

            def synchronize(self):
                gpu.syncs += 1
                gpu.done_ms = max(gpu.done_ms, self.t_ms)

        return Event


@pytest.fixture
def fake_cuda(monkeypatch):
    gpu = FakeGpu()
    monkeypatch.setattr(timing, "cuda_in_use", lambda: True)
    monkeypatch.setattr(torch.cuda, "Event", gpu.event_class())
    return gpu


def async_step(hook, gpu: FakeGpu, sync: bool = True) -> None:
    """The issue's second loop: evaluation queues 60 ms and returns; the update queues 20 ms. ``sync``: generation
    ends in a host sync (which also completes the previous step's work)."""
    with hook.phase("generation"):
        gpu.now_ms += 20
        if sync:
            gpu.done_ms = gpu.now_ms
    with hook.phase("evaluation"):
        gpu.now_ms += 60  # launched, not waited for
    with hook.phase("wait"):  # waiting for rollout: wall time only, no events
        pass
    with hook.phase("update"):
        gpu.now_ms += 20


def test_a_report_waits_for_its_events_and_then_carries_gpu_time(fake_cuda):
    gpu, sent = fake_cuda, Sent()
    hook = hook_with(sent)
    async_step(hook, gpu)
    hook.step_end(samples=4)
    assert sent.steps == []  # its events have not run yet: held, not waited for
    gpu.done_ms = gpu.now_ms  # the GPU caught up
    async_step(hook, gpu)
    hook.step_end(samples=4)
    assert sent.steps == [0]  # step 0 resolved at the next boundary; step 1 still running
    assert sent.bodies[0]["gpu_phases"] == {"generation": 0.02, "evaluation": 0.06, "update": 0.02}
    assert "wait" in sent.bodies[0]["phases"] and "wait" not in sent.bodies[0]["gpu_phases"]
    assert hook.last_report.step == 1 and hook.last_report.gpu_phases_s == {}
    assert gpu.syncs == 0  # the hot path never waits for the GPU
    hook.close()  # the loop is done: now it may wait
    assert sent.steps == [0, 1] and sent.bodies[1]["gpu_phases"]["evaluation"] == 0.06


def test_a_step_whose_events_never_complete_goes_without_gpu_time_and_in_order(fake_cuda):
    gpu, sent = fake_cuda, Sent()
    hook = hook_with(sent)
    for _ in range(GPU_WAIT_STEPS + 1):
        async_step(hook, gpu, sync=False)  # a stream that never drains (or a loop that never syncs)
        hook.step_end(samples=4)
    assert sent.steps == [0]  # waited GPU_WAIT_STEPS boundaries, then sent as it is
    assert "gpu_phases" not in sent.bodies[0]
    gpu.done_ms = gpu.now_ms
    async_step(hook, gpu)
    hook.step_end(samples=4)
    assert sent.steps == list(range(GPU_WAIT_STEPS + 1))  # the rest resolved, in step order
    assert all(b["gpu_phases"]["evaluation"] == 0.06 for b in sent.bodies[1:])
    assert gpu.syncs == 0
    hook.close()


def test_cuda_events_off_sends_at_once(fake_cuda):
    gpu, sent = fake_cuda, Sent()
    hook = hook_with(sent, cuda_events=False)
    async_step(hook, gpu)
    hook.step_end(samples=4)
    assert sent.steps == [0] and "gpu_phases" not in sent.bodies[0]
    hook.close()
