"""The record of one step (one rank, one step) as the hook keeps it (``StepReport``), and its wire form: exactly the
contract's fields. What sends it is :mod:`trimtab.trainer.server_link`.

``StepReport``'s fields are made from the contract (:data:`trimtab.contract.step_report.REPORT_FIELDS`): every
top-level field by its name, the phases in ``phases_s``, their GPU time in ``gpu_phases_s`` (filled in by the hook
once the step's CUDA events completed), the allocator statistics in ``memory``, the learning signals in ``learning``. Beside them it keeps what only
local readers use (``hook.last_report``): the component, the probe's baseline, the OOM'd batch size. The API refuses unknown fields (a typo must not pass silently), so ``to_wire()`` sends the
contract's fields only, each cleaned by its kind.
"""

from __future__ import annotations

from dataclasses import field, make_dataclass
from typing import Any, Optional

from trimtab.contract.step_report import GPU_PHASES_GROUP, LEARNING_GROUP, MEMORY_GROUP, PHASES_GROUP, to_wire, \
    top_level


class _Report:
    @property
    def samples_per_s(self) -> Optional[float]:
        return self.samples / self.step_time_s if self.samples is not None and self.step_time_s > 0 else None

    @property
    def tokens_per_s(self) -> Optional[float]:
        return self.tokens / self.step_time_s if self.tokens is not None and self.step_time_s > 0 else None

    def to_wire(self) -> dict[str, Any]:
        """The JSON body of ``POST /v1/jobs/{name}/reports`` (one of ``reports`` in a batch's); absent values are
        omitted, never sent as 0."""
        report = {f.name: getattr(self, f.name) for f in top_level()}
        return to_wire({**report, PHASES_GROUP: self.phases_s, GPU_PHASES_GROUP: self.gpu_phases_s,
                        MEMORY_GROUP: self.memory or {}, LEARNING_GROUP: self.learning or {}})


StepReport = make_dataclass("StepReport", [
    *((f.name, f.kind.type) for f in top_level() if f.required),
    ("phases_s", dict, field(default_factory=dict)),                 # phase → seconds (the contract's phases)
    ("gpu_phases_s", dict, field(default_factory=dict)),             # phase → GPU seconds (CUDA events), this step
    *((f.name, Optional[f.kind.type], field(default=None)) for f in top_level() if not f.required),
    ("memory", Optional[dict], field(default=None)),                  # the contract's memory keys, and more
    ("learning", Optional[dict], field(default=None)),                # the contract's learning signals
    # Local only (not in the contract):
    ("component", Optional[str], field(default=None)),
    ("collective_baseline_us", Optional[float], field(default=None)),
    ("oom", Optional[dict], field(default=None)),                    # {"ooms", "failed_batch_size", "new_batch_size"}
], bases=(_Report,))
StepReport.__module__ = __name__
StepReport.__doc__ = ("One rank's report of one step: the contract's fields (``phases_s`` and ``memory`` hold its "
                      "groups) and the hook's local ones.")
