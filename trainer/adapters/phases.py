"""Driving hook phases from a framework's begin/end callbacks, which come as separate calls, not with-blocks."""

from __future__ import annotations

from typing import Any, Callable, Optional

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
