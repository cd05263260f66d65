"""The GPU-time ledger: per job, per GPU, per interval, GPU-seconds busy by role and phase and idle by cause
(waiting for which role, host-side work, communication, no job). See :mod:`.model` for its cells and rules,
:mod:`.timeline`, :mod:`.attribute` and :mod:`.compute` for how it is built, :mod:`.read` for the store's side."""
