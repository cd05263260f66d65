"""The control loop: plans per job (:mod:`.controller` over :mod:`.plan`), the verdict on a change
(:mod:`.verdict`, :mod:`.follow_up`), the bracket search (:mod:`.bracket`), the memory model (:mod:`.memory_fit`,
:mod:`.memory_forecast`) and placement (:mod:`.placement`). The service that runs it in `trimtab up` and
`trimtab server` is :class:`trimtab.control.service.Rebalancer` (not loaded here)."""

from trimtab.control.controller import plan
from trimtab.control.plan import JobState, NewChange, Plan, Wait
from trimtab.control.verdict import Sample

__all__ = ["JobState", "NewChange", "Plan", "Sample", "Wait", "plan"]
