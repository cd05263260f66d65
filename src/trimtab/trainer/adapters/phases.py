"""Driving hook phases from a framework's begin/end callbacks, which come as separate calls, not with-blocks, and
reporting a step at the next step's start, once the framework has done (and logged) all it does after it."""

from __future__ import annotations

import logging
import os
import re
from typing import Any, Callable, Mapping, Optional

from trimtab.trainer.hook import Hook
from trimtab.trainer.timing import Phase


class PhaseSwitch:
    """At most one phase open at a time: ``switch("update")`` closes the open one and opens "update";
    ``switch(None)`` just closes."""

    def __init__(self, hook: Hook):
        self.hook = hook
        self._open: Optional[Phase] = None

    def switch(self, name: Optional[str]) -> None:
        if self._open is not None:
            self._open.__exit__(None, None, None)
            self._open = None
        if name is not None:
            self._open = self.hook.phase(name)
            self._open.__enter__()


class PhaseStack(PhaseSwitch):
    """A ``PhaseSwitch`` whose phases may be entered inside one another (a framework's generate call inside its
    scoring call inside a training step): ``push`` switches to a phase, ``pop`` back to the one it interrupted.
    Time is never counted twice: only the innermost phase is open."""

    def __init__(self, hook: Hook):
        super().__init__(hook)
        self._stack: list[Optional[str]] = []

    def switch(self, name: Optional[str]) -> None:
        self._stack = [name] if name is not None else []
        super().switch(name)

    def push(self, name: str) -> None:
        self._stack.append(name)
        super().switch(name)

    def pop(self) -> None:
        if self._stack:
            self._stack.pop()
        super().switch(self._stack[-1] if self._stack else None)


class DeferredStep:
    """A step the framework ended, reported at the next step's start (or at the end of training): what the framework
    does after a step — logging it, a validation run, a checkpoint — belongs to that step, and the values it logs
    for the step reach the same report. Each report's time runs from the previous boundary to this one."""

    def __init__(self, hook: Hook):
        self.hook = hook
        self._pending: Optional[dict[str, Any]] = None

    @property
    def step(self) -> Optional[int]:
        """The step waiting to be reported, if any."""
        return None if self._pending is None else self._pending["step"]

    def end(self, step: int, **report: Any) -> None:
        """The framework ended ``step``: hold its report (``hook.step_end``'s arguments) until :meth:`flush`."""
        self.flush()
        self._pending = {"step": int(step), **report}

    def log(self, values: Mapping[str, Any], learning: Optional[Mapping[str, float]] = None,
            **framework: Any) -> None:
        """Values the framework logged for the held step: kept in its report's ``logged`` (and ``framework``
        fields such as ``reward_mean``, where given); ``learning``: the learning signals read from them."""
        if self._pending is None:
            return
        fw = self._pending.setdefault("framework", {})
        fw.setdefault("logged", {}).update(values)
        fw.update({k: v for k, v in framework.items() if v is not None})
        if learning:
            self._pending.setdefault("learning", {}).update(learning)

    def flush(self) -> None:
        """Report the held step now (no-op without one)."""
        pending, self._pending = self._pending, None
        if pending is not None:
            self.hook.step_end(**pending)


def env_or(value: Optional[str], name: str) -> Optional[str]:
    """An explicit setting, else the environment's ``name`` (empty counts as unset)."""
    return value if value is not None else (os.environ.get(name) or None)


def job_slug(name: str) -> str:
    """A run name as a job name the API takes (letters, digits and . _ -, ≤ 128, starting with one of the first two)."""
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", str(name)).strip("-._")
    return slug[:128] or "job"


def lazy_hook(job: Optional[str], default_job: str, server: Optional[str], token: Optional[str],
              **options: Any) -> Hook:
    """The hook an adapter sets up itself (a callback passed as a class): ``TRIMTAB_SERVER``, ``TRIMTAB_JOB``
    (else ``default_job``, e.g. the run name) and ``TRIMTAB_TOKEN`` fill what the caller left out. Without a
    server it is a standalone hook (reports stay local) and says so once."""
    from trimtab.trainer.hook import attach

    server = env_or(server, "TRIMTAB_SERVER")
    if server is None:
        logging.getLogger("trimtab.trainer").warning(
            "trimtab: TRIMTAB_SERVER is not set: step reports stay in this process (hook.last_report)")
    return attach(job_slug(env_or(job, "TRIMTAB_JOB") or default_job), server, env_or(token, "TRIMTAB_TOKEN"),
                  **options)


class Refuse:
    """The applier of knobs a framework cannot change between steps: every change is refused with ``reason``."""

    def __init__(self, reason: str):
        self.reason = reason

    def apply(self, change) -> None:
        change.refused(self.reason)


def batch_len(batch: Any) -> Optional[int]:
    """Samples in a batch: a tensor's first dimension, or that of the first tensor in a tuple, list or dict."""
    if hasattr(batch, "shape") and len(getattr(batch, "shape", ())) > 0:
        return int(batch.shape[0])
    items = batch.values() if isinstance(batch, dict) else batch if isinstance(batch, (list, tuple)) else ()
    for item in items:
        n = batch_len(item)
        if n is not None:
            return n
    return None


def lazy_class(module: str, name: str, build: Callable[[], type]) -> Callable[[str], Any]:
    """A module ``__getattr__`` that builds class ``name`` on first use, so the module imports without the
    framework the class derives from."""
    built: dict[str, type] = {}

    def __getattr__(attr: str) -> Any:
        if attr != name:
            raise AttributeError(f"module {module!r} has no attribute {attr!r}")
        if name not in built:
            cls = build()
            cls.__qualname__ = cls.__name__ = name
            built[name] = cls
        return built[name]

    return __getattr__
