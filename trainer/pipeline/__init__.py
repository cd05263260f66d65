"""The reference RL post-training pipeline (actor / critic / reward / reference) the rebalancer acts on.

    from trimtab.trainer.pipeline import Pipeline, preset
    with Pipeline(preset("tiny"), "cpu", knobs={"batch_size": 8, "prefetch": 2, "sync_every": 1}) as job:
        for record in job.run(10):
            print(record.line())

Or from the shell: ``python -m trimtab.trainer.pipeline --help``.
"""

from .config import DEFAULT_KNOBS, PRESETS, DeviceMap, Knobs, PipelineConfig, parse_device_map, preset
from .loop import Pipeline, StepRecord

__all__ = ["DEFAULT_KNOBS", "PRESETS", "DeviceMap", "Knobs", "Pipeline", "PipelineConfig", "StepRecord",
           "parse_device_map", "preset"]
