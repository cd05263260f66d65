"""What the verl plugin does when trimtab's own parts cannot load: say so once, in the process that runs ``fit``.

verl's loader (``verl/__init__.py``) imports every ``verl.plugins`` entry point in every process that imports verl
and logs one that raises at DEBUG only, so a trimtab that cannot load would be silently absent. Instead the plugin
(:mod:`.verl_plugin`) never raises into the loader, and where loading failed it wraps only verl's ``fit`` methods,
through its post-import hook, so that the first ``fit`` to start in a process logs one WARNING line with the
reason and then runs unchanged. Standard library only: this is the path taken when the rest of trimtab cannot
be imported.
"""

from __future__ import annotations

import functools
import inspect
import logging
import threading
from typing import Any, Callable

log = logging.getLogger("trimtab.trainer")

# (module, class, method): every verl fit trimtab attaches to (verl_plugin.py, verl_async.py)
FITS = (
    ("verl.trainer.ppo.v1.trainer_base", "PPOTrainer", "fit"),
    ("verl.trainer.ppo.ray_trainer", "RayPPOTrainer", "fit"),
    ("verl.experimental.fully_async_policy.fully_async_trainer", "FullyAsyncTrainer", "fit"),
    ("verl.experimental.fully_async_policy.fully_async_rollouter", "FullyAsyncRollouter", "fit"),
    ("verl.experimental.one_step_off_policy.ray_trainer", "OneStepOffRayTrainer", "fit"),
)
NOTICE = "__trimtab_notice__"


class _Once:
    """One line per process, whichever fit starts first (a subclass's fit calling its base's says nothing more)."""

    def __init__(self, why: str):
        self.why, self._said, self._lock = why, False, threading.Lock()

    def say(self, owner: Any) -> None:
        with self._lock:
            if self._said:
                return
            self._said = True
        log.warning("trimtab: not attached to verl's %s fit(): %s; training continues without trimtab",
                    type(owner).__name__, self.why)


def _wrap(original: Callable, once: _Once) -> Callable:
    if inspect.iscoroutinefunction(original):
        @functools.wraps(original)
        async def fit(self, *args, **kwargs):
            once.say(self)
            return await original(self, *args, **kwargs)
    else:
        @functools.wraps(original)
        def fit(self, *args, **kwargs):
            once.say(self)
            return original(self, *args, **kwargs)
    setattr(fit, NOTICE, True)
    return fit


def notice_patches(why: str) -> dict[str, Callable[[Any], None]]:
    """module name → a patch that wraps that module's fit to say ``why`` once (for the plugin's post-import hook)."""
    once = _Once(why)

    def patch_for(cls_name: str, method: str) -> Callable[[Any], None]:
        def patch(module: Any) -> None:
            cls = getattr(module, cls_name)
            cls = getattr(cls, "__ray_actor_class__", cls)  # the async trainers are @ray.remote classes
            original = cls.__dict__.get(method)
            if original is not None and not getattr(original, NOTICE, False):
                setattr(cls, method, _wrap(original, once))
        return patch

    return {module: patch_for(cls_name, method) for module, cls_name, method in FITS}
