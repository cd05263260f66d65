"""The reference RL post-training pipeline (actor / critic / reward / reference) the rebalancer acts on.

    from trimtab.workload import Pipeline, preset
    with Pipeline(preset("tiny"), "cpu", knobs={"batch_size": 8, "prefetch": 2, "sync_every": 1}) as job:
        for record in job.run(10):
            print(record.line())

Or from the shell: ``python -m trimtab.workload --help``.
"""

from importlib import import_module

# Loaded on first use, so that ``python -m trimtab.workload`` (and `trimtab demo`) can say "install torch"
# in one line where torch is missing, instead of failing inside this package's import.
_WHERE = {"DEFAULT_KNOBS": "config", "PRESETS": "config", "DeviceMap": "config", "Knobs": "config",
          "PipelineConfig": "config", "parse_device_map": "config", "preset": "config", "Pipeline": "loop",
          "StepRecord": "loop"}


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f"{__name__}.{_WHERE[name]}"), name)
    globals()[name] = value
    return value


__all__ = ["DEFAULT_KNOBS", "PRESETS", "DeviceMap", "Knobs", "Pipeline", "PipelineConfig", "StepRecord",
           "parse_device_map", "preset"]
