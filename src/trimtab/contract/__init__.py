"""What crosses a boundary, defined once: what a training job and the daemon exchange — the step report
(:mod:`.step_report`), knob declarations, pending knob changes and the job's answers to them (:mod:`.knobs`), where
the job's roles run (:mod:`.roles`), and the kinds of value their fields take (:mod:`.kinds`) — and what the agent
ships: the GPU readings (:mod:`.readings`), the sink protocol every destination implements (:mod:`.sink`), and the
words the daemon answers with (:mod:`.statuses`: grades, knob-change statuses, decision outcomes).

Plain data and the small functions that clean, flatten and fold it; no torch, pydantic or SQLAlchemy, so the hook
(``trimtab.trainer``), `trimtab verl-tail`, the agent, the store and the API all import it. Generated from it: the
hook's wire form, the API's request and response models, the store's ``job_reports`` columns and the rebalancer's
step view.
"""

from trimtab.contract import statuses
from trimtab.contract.knobs import ChangeAck, ChangeRefusal, KnobDeclaration, PendingChange
from trimtab.contract.readings import (GPU_METRIC_NAMES, GPU_METRICS, Batch, GpuInfo, GpuProcess, GpuSample,
                                       HealthEvent, HostSample, NodeInfo, NvlinkSample, Readings)
from trimtab.contract.roles import RolePlacement, device_map_of
from trimtab.contract.sink import BatchRefused, Sink, SinkMisconfigured, SinkUnavailable
from trimtab.contract.step_report import fold_ranks, to_columns, to_wire

__all__ = ["GPU_METRICS", "GPU_METRIC_NAMES", "Batch", "BatchRefused", "ChangeAck", "ChangeRefusal", "GpuInfo",
           "GpuProcess", "GpuSample", "HealthEvent", "HostSample", "KnobDeclaration", "NodeInfo", "NvlinkSample",
           "PendingChange", "Readings", "RolePlacement", "Sink", "SinkMisconfigured", "SinkUnavailable",
           "device_map_of", "fold_ranks", "statuses", "to_columns", "to_wire"]
