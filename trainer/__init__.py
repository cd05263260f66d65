"""The hook a training job uses to report itself to trimtab and receive knob changes (``attach``), and the
framework adapters (``trimtab.trainer.adapters``). Imports torch and httpx only: a training environment needs
neither the server's web stack nor its database drivers."""

from trimtab.trainer.hook import Hook, OomEvent, attach
from trimtab.trainer.report import StepReport
from trimtab.trainer.reporter import Reporter

__all__ = ["Hook", "OomEvent", "Reporter", "StepReport", "attach"]
