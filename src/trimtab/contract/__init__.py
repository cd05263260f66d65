"""What a training job and the daemon exchange, defined once: the step report (:mod:`.step_report`), knob
declarations, pending knob changes and the job's answers to them (:mod:`.knobs`), where the job's roles run
(:mod:`.roles`), and the kinds of value their fields take (:mod:`.kinds`).

Plain data and the small functions that clean, flatten and fold it; no torch, pydantic or SQLAlchemy, so the hook
(``trimtab.trainer``), `trimtab verl-tail` and the daemon all import it. Generated from it: the hook's wire form,
the API's request and response models, the store's ``job_reports`` columns and the rebalancer's step view.
"""
