"""What the hook says about memory it does not own and the batch a step ran at (issue 38): the GPU's free memory
rides on each memory sample beside the allocator's figures, and every report names the knob values its step ran
at — after the hook's own OOM halving too, which no change records."""

from __future__ import annotations

import torch

from trimtab.trainer import attach
from trimtab.trainer.memory import MemorySampler

GIB = 2**30


def test_the_memory_sample_carries_the_gpus_free_memory_as_the_job_sees_it():
    sampler = MemorySampler(every_s=5.0, stats_fn=lambda: {"reserved_bytes.all.current": 40 * GIB},
                            enabled_fn=lambda: True, total_fn=lambda: 141 * GIB, free_fn=lambda: 30 * GIB)
    out = sampler.maybe_sample(0.0)
    assert (out["free_bytes"], out["reserved_bytes"], out["total_bytes"]) == (30 * GIB, 40 * GIB, 141 * GIB)
    assert out["total_bytes"] - out["free_bytes"] - out["reserved_bytes"] == 71 * GIB  # another process's


def test_a_cpu_job_passes_its_free_memory_and_the_report_keeps_it():
    hook = attach("cpu-free", knobs={"batch_size": (8, 1, 64)})
    hook.step_end(samples=8, memory={"peak_allocated_bytes": 9 * GIB, "total_bytes": 64 * GIB,
                                     "free_bytes": 20 * GIB})
    wire = hook.last_report.to_wire()
    assert wire["memory"]["free_bytes"] == 20 * GIB and wire["memory"]["total_bytes"] == 64 * GIB
    hook.close()


def test_each_report_names_the_batch_its_step_ran_at_after_the_hooks_own_oom_halving_too():
    hook = attach("halved", knobs={"batch_size": (71, 1, 128)})
    ran = []
    for step in range(3):
        with hook.oom_guard():
            if step == 1:
                raise torch.cuda.OutOfMemoryError("CUDA out of memory (simulated)")
        hook.step_end(samples=0 if hook.last_oom else hook.knobs["batch_size"])
        ran.append(hook.last_report.to_wire()["knobs"]["batch_size"])
    hook.close()
    assert ran == [71, 71, 35]  # the step that OOMed ran at 71; the one after at the halved size
