"""trimtab inside verl, attached the way verl loads extensions: a ``verl.plugins`` entry point.

``import verl`` loads every registered ``verl.plugins`` entry point in every process that imports it — the driver,
the ``TaskRunner`` Ray actor that runs ``fit``, the workers (``verl/__init__.py``; ``VERL_USE_EXTERNAL_PLUGINS=none``
turns plugins off). Installing trimtab registers this module there. Loading it only arranges, through a post-import
hook, that these verl functions are wrapped once their modules are imported:

* ``PPOTrainer.fit`` (V1, ``verl/trainer/ppo/v1/trainer_base.py``) and ``RayPPOTrainer.fit`` (legacy,
  ``verl/trainer/ppo/ray_trainer.py``): at the start of ``fit`` a session attaches the hook (if the run is
  configured for trimtab, see below) and puts knob-carrying proxies in place of the trainer's worker groups; when
  ``fit`` ends — normally, by its early ``return`` on the last step, or by an exception — the session closes the
  hook and restores them.
* ``Tracking.log`` (``verl/utils/tracking.py``), which both fit loops call once per step with every metric (the
  same dict the ``file`` logger writes): the session turns it into the step report
  (:mod:`~trimtab.trainer.adapters.verl_metrics`, shared with ``trimtab verl-tail``) and ends the hook's step.
* The experimental async trainers' ``async def fit`` overrides (``FullyAsyncTrainer``, ``FullyAsyncRollouter``,
  ``OneStepOffRayTrainer``) and the fully-async knob points: :mod:`~trimtab.trainer.adapters.verl_async`.
* V1 ``separate_async``'s ``on_step_begin`` / ``on_step_end``, where its ``prefetch``
  (``trainer.v1.sampler.max_off_policy_threshold``) and ``sync_every`` (``parameter_sync_step``) are installed and
  acknowledged: :mod:`~trimtab.trainer.adapters.verl_v1_async`.

Loading never raises into verl's loader (it would log the failure at DEBUG only). A fit trimtab is not attached to
gets one WARNING line, in the process that runs it, saying why: trimtab failed to import (at load: only the fit
methods are wrapped, to say so, :mod:`~trimtab.trainer.adapters.verl_plugin_notice`; or when the fit starts), the run
names no server, its token file is wrong, or attaching failed; a verl whose signatures changed says so when the
module is wrapped. A server that does not answer leaves the hook attached and spooling (its own "offline" line).

Nothing changes verl's behaviour or its trainer name. The wrapped signatures are checked when the wrappers are
installed: a verl release that changes them leaves trimtab detached with a warning (and fails trimtab's tests,
which run verl's real fit loops).

Configuration — a run is attached when it names a server, by Hydra override (travels with the config to every
Ray node) or environment (the process that runs ``fit``):

=====================  =========================  ==========================================================
Hydra override         environment                meaning
=====================  =========================  ==========================================================
``+trimtab.server``    ``TRIMTAB_SERVER``         the trimtab ``up``/``server`` URL(s), by commas (required)
``+trimtab.job``       ``TRIMTAB_JOB``            the job's name (default: ``trainer.experiment_name``)
``+trimtab.token_file`` ``TRIMTAB_TOKEN_FILE``    a file holding a ``job`` token (or ``TRIMTAB_TOKEN``)
``+trimtab.mode``      ``TRIMTAB_MODE``           auto / advise / off at registration (default: the server's)
``+trimtab.knobs``     ``TRIMTAB_KNOBS``          ``false`` / ``0``: report only, declare no knobs
``+trimtab.device_map`` ``TRIMTAB_DEVICE_MAP``    ``"actor=0,1 critic=2"``: overrides the device map found
=====================  =========================  ==========================================================

Each worker group's roles, node, GPUs and pids are found when ``fit`` starts
(:mod:`~trimtab.trainer.adapters.verl_roles`) and registered with the job; the device map comes from them unless
``device_map`` overrides it.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import importlib.abc
import importlib.machinery
import inspect
import logging
import os
import sys
from typing import Any, Callable, Optional

log = logging.getLogger("trimtab.trainer")

_session: contextvars.ContextVar[Optional["VerlSession"]] = contextvars.ContextVar("trimtab_verl", default=None)
WRAPPED = "__trimtab_wrapped__"


# -- configuration ----------------------------------------------------------------------------------------------

def _setting(config: Any, key: str, env: str) -> Optional[str]:
    from trimtab.trainer.adapters.verl_knobs import select

    value = select(config, f"trimtab.{key}")
    if value is None:
        value = os.environ.get(env)
    return None if value is None or str(value) == "" else str(value)


def settings(config: Any) -> Optional[dict[str, Any]]:
    """The trimtab settings of this run, or None when it names no server (trimtab stays out of the way)."""
    from trimtab.trainer.adapters.verl_knobs import select

    server = _setting(config, "server", "TRIMTAB_SERVER")
    if server is None:
        return None
    from trimtab.paths import token_from

    token = _setting(config, "token", "TRIMTAB_TOKEN")
    # A token given outright wins over a file; either is checked (BadToken names the file and what is wrong).
    token = token_from(token, None if token is not None else _setting(config, "token_file", "TRIMTAB_TOKEN_FILE"),
                       "+trimtab.token (or TRIMTAB_TOKEN)")
    knobs = (_setting(config, "knobs", "TRIMTAB_KNOBS") or "true").lower() not in ("false", "0", "no", "off")
    typed = _setting(config, "device_map", "TRIMTAB_DEVICE_MAP")
    from trimtab.trainer.adapters.verl import parse_device_map

    return {"server": server, "token": token,
            "job": _setting(config, "job", "TRIMTAB_JOB") or str(select(config, "trainer.experiment_name", "verl")),
            "mode": _setting(config, "mode", "TRIMTAB_MODE"), "knobs": knobs,
            "device_map": parse_device_map(typed.replace(";", " ").split()) if typed else None}


# -- one fit() ----------------------------------------------------------------------------------------------------

class VerlSession:
    """trimtab attached to one verl ``fit()``: the hook, the knob applier and the worker-group proxies."""

    def __init__(self, trainer: Any, kind: str, options: dict[str, Any]):
        from trimtab.contract.roles import device_map_of
        from trimtab.trainer.adapters.learning_names import LearningNames
        from trimtab.trainer.adapters.verl_knobs import VerlKnobApplier, declared_knobs, wrap_worker_groups
        from trimtab.trainer.adapters.verl_roles import find_roles
        from trimtab.trainer.hook import attach

        self.trainer, self.kind = trainer, kind
        config = trainer.config
        declared = declared_knobs(config, ref_in_actor=bool(getattr(trainer, "ref_in_actor", False)),
                                  use_critic=bool(getattr(trainer, "use_critic", False)),
                                  use_reference=bool(getattr(trainer, "use_reference_policy", False)),
                                  v1=kind == "v1") \
            if options["knobs"] else {}
        world = (getattr(getattr(trainer, "resource_pool_manager", None), "get_n_gpus", lambda: 1)() or 1)
        self.applier = VerlKnobApplier(declared, step_of=lambda: int(getattr(trainer, "global_steps", 0) or 0),
                                       world_size=int(world))
        knobs = {k: (spec, why) for k, (_, spec, why) in declared.items()}
        appliers: dict[str, Any] = {k: self.applier for k in declared}
        self.v1_async, not_live = self._v1_async(trainer, kind, options)
        if self.v1_async is not None:
            knobs.update(self.v1_async.knobs)
            appliers.update({k: self.v1_async for k in self.v1_async.knobs})
        try:
            self.roles = find_roles(trainer)
            device_map = options.get("device_map") or device_map_of(self.roles)
            self.hook = attach(options["job"], options["server"], options["token"], mode=options["mode"],
                               device_map=device_map, roles=self.roles,
                               knobs={k: spec for k, (spec, _) in knobs.items()}, appliers=appliers,
                               memory_every_s=0.0)
        except BaseException:
            if self.v1_async is not None:
                self.v1_async.close()
            raise
        self._unwrap = wrap_worker_groups(trainer, self.applier)
        self.unmapped: set[str] = set()
        self.learning_names = LearningNames("verl")
        log.warning("trimtab: attached to verl %s fit() as job %r (%s), knobs: %s%s", kind, options["job"],
                    options["server"], ", ".join(f"{k} {spec[0]} in [{spec[1]}, {spec[2]}] ({why})"
                                                 for k, (spec, why) in knobs.items()) or "none",
                    "".join(f"; {k} not live: {why}" for k, why in not_live.items()))

    @staticmethod
    def _v1_async(trainer: Any, kind: str, options: dict[str, Any]) -> tuple[Optional[Any], dict[str, str]]:
        """V1 separate_async's prefetch and sync_every (:mod:`.verl_v1_async`), where this run can move them."""
        from trimtab.trainer.adapters.verl_v1_async import V1AsyncApplier, declare, separate_async

        if kind != "v1" or not options["knobs"] or not separate_async(trainer.config):
            return None, {}
        live, not_live = declare(trainer)
        return (V1AsyncApplier(trainer, live) if live else None), not_live

    def on_log(self, data: Any, step: Any) -> None:
        from trimtab.trainer.adapters.verl_metrics import verl_step

        record = verl_step(step, data, trainer=self.kind, names=self.learning_names)
        if record is None:
            return  # the validation line before training: not a step
        new = set(record.unmapped_timers) - self.unmapped
        if new:
            self.unmapped |= new
            log.warning("trimtab: verl timers counted as 'other': %s", ", ".join(sorted(new)))
        phases = {k: v for k, v in record.phases_s.items() if k != "other"}
        self.hook.step_end(samples=record.samples, tokens=record.tokens, step=record.step, phases_s=phases,
                           step_time_s=record.step_time_s, memory=record.memory, rollout_s=record.rollout_s,
                           learning=record.learning)

    def close(self) -> None:
        try:
            self._unwrap()
            if self.v1_async is not None:
                self.v1_async.close()
        finally:
            self.hook.close()


NO_SERVER = "no server named (+trimtab.server=URL on verl's command line, or TRIMTAB_SERVER)"


def not_attached(what: str, why: str) -> None:
    """The one WARNING line a fit that trimtab is not attached to gets, in the process that runs it: verl logs a
    plugin that failed to load at DEBUG only, so without this line nobody would know."""
    log.warning("trimtab: not attached to verl's %s: %s; training continues without trimtab", what, why)


def start_session(owner: Any, make: Callable[[Any, dict], Any], what: str = "fit()") -> Optional[Any]:
    """A session for this fit (``make(owner, options)``), or None (not configured, or trimtab failed: training goes
    on without it, and one WARNING line says why). Shared by the synchronous trainers' fit and the async trainers'
    (verl_async.py)."""
    what = f"{type(owner).__name__} {what}"
    try:
        from trimtab.paths import BadToken
    except BaseException as exc:
        not_attached(what, f"trimtab failed to import ({type(exc).__name__}: {exc})")
        return None
    try:
        options = settings(owner.config)
        if options is None:
            not_attached(what, NO_SERVER)
            return None
        return make(owner, options)
    except BadToken as exc:  # a configuration waiting cannot fix: one clear line, no traceback, stay detached
        not_attached(what, str(exc))
    except ImportError as exc:  # a dependency of the hook (httpx, torch) missing or broken in this environment
        not_attached(what, f"trimtab failed to import ({type(exc).__name__}: {exc})")
    except Exception as exc:
        not_attached(what, f"{type(exc).__name__}: {exc}")
        log.debug("trimtab: attaching to verl's %s failed", what, exc_info=True)
    return None


def current_session() -> Optional[Any]:
    """The session of the fit running in this context (None: none attached)."""
    return _session.get()


@contextlib.contextmanager
def bound(session: Optional[Any]):
    """``session`` is the one ``Tracking.log`` reports through while the fit runs; closed after it, quietly."""
    token = _session.set(session)
    try:
        yield session
    finally:
        _session.reset(token)
        if session is not None:
            try:
                session.close()
            except Exception:
                log.warning("trimtab: closing the verl session failed", exc_info=True)


def _start(trainer: Any, kind: str) -> Optional[VerlSession]:
    """A synchronous trainer's session for this fit (``kind``: which trainer), or None."""
    return start_session(trainer, lambda owner, options: VerlSession(owner, kind, options))


def _wrap_fit(original: Callable, kind: str) -> Callable:
    @functools.wraps(original)
    def fit(self, *args, **kwargs):
        if _session.get() is not None:  # a subclass's fit calling its base's: one session
            return original(self, *args, **kwargs)
        with bound(_start(self, kind)):
            return original(self, *args, **kwargs)

    setattr(fit, WRAPPED, True)
    return fit


def _wrap_log(original: Callable) -> Callable:
    @functools.wraps(original)
    def log_metrics(self, data, step, *args, **kwargs):
        result = original(self, data, step, *args, **kwargs)
        session = _session.get()
        if session is not None:
            try:
                session.on_log(data, step)
            except Exception:  # a report that cannot be built must not stop training
                log.warning("trimtab: could not report verl step %s", step, exc_info=True)
        return result

    setattr(log_metrics, WRAPPED, True)
    return log_metrics


# -- installing the wrappers ------------------------------------------------------------------------------------

def _install(owner: type, name: str, wrap: Callable[[Callable], Callable], params: tuple[str, ...]) -> bool:
    original = owner.__dict__.get(name)
    if original is None or getattr(original, WRAPPED, False):
        return bool(original)
    got = tuple(inspect.signature(original).parameters)
    if got[:len(params)] != params:
        log.warning("trimtab: verl's %s.%s%s is not the %s trimtab knows; trimtab is not attached (update trimtab)",
                    owner.__qualname__, name, got, params)
        return False
    setattr(owner, name, wrap(original))
    return True


def _patch_v1(module: Any) -> None:
    _install(module.PPOTrainer, "fit", lambda f: _wrap_fit(f, "v1"), ("self", "agent_loop_manager"))


def _patch_legacy(module: Any) -> None:
    _install(module.RayPPOTrainer, "fit", lambda f: _wrap_fit(f, "legacy"), ("self",))


def _patch_tracking(module: Any) -> None:
    _install(module.Tracking, "log", _wrap_log, ("self", "data", "step"))


TARGETS: dict[str, Callable[[Any], None]] = {
    "verl.trainer.ppo.v1.trainer_base": _patch_v1,
    "verl.trainer.ppo.ray_trainer": _patch_legacy,
    "verl.utils.tracking": _patch_tracking,
}


def _more_targets() -> None:
    """The async trainers' ``async def fit`` overrides (and their knob points), :mod:`.verl_async`, and V1
    separate_async's knob points, :mod:`.verl_v1_async`."""
    from trimtab.trainer.adapters.verl_async import TARGETS as ASYNC
    from trimtab.trainer.adapters.verl_v1_async import TARGETS as V1_ASYNC

    TARGETS.update(ASYNC)
    TARGETS.update(V1_ASYNC)


class _PatchingLoader(importlib.abc.Loader):
    def __init__(self, loader: importlib.abc.Loader, patch: Callable[[Any], None]):
        self._loader, self._patch = loader, patch

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:
        self._loader.exec_module(module)
        try:
            self._patch(module)
        except Exception:
            log.warning("trimtab: could not wrap %s", module.__name__, exc_info=True)


class _PostImportHook(importlib.abc.MetaPathFinder):
    """Wraps a target module's functions right after the module runs (the standard post-import hook pattern)."""

    def find_spec(self, name, path, target=None):
        patch = TARGETS.get(name)
        if patch is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _PatchingLoader(spec.loader, patch)
                return spec
        return None


def install() -> None:
    """Idempotent: wrap what is imported already, hook what is not."""
    for name, patch in TARGETS.items():
        module = sys.modules.get(name)
        if module is not None:
            try:
                patch(module)
            except Exception:
                log.warning("trimtab: could not wrap %s", name, exc_info=True)
    if not any(isinstance(f, _PostImportHook) for f in sys.meta_path):
        sys.meta_path.insert(0, _PostImportHook())


def _load() -> None:
    """What verl's plugin loader runs (``import verl``, every process). It never raises into the loader, which
    would log the failure at DEBUG only: where trimtab's own parts cannot load, only verl's fit methods are wrapped,
    to say so in one WARNING line in the process that runs ``fit`` (:mod:`.verl_plugin_notice`, standard library
    only)."""
    try:
        _more_targets()
    except BaseException as exc:
        why = f"trimtab failed to import ({type(exc).__name__}: {exc})"
        try:
            from trimtab.trainer.adapters.verl_plugin_notice import notice_patches

            TARGETS.clear()
            TARGETS.update(notice_patches(why))
        except BaseException:
            log.warning("trimtab: not attached to verl: %s", why)
            return
    try:
        install()
    except BaseException as exc:
        log.warning("trimtab: not attached to verl: installing its wrappers failed (%s: %s)", type(exc).__name__, exc)


_load()
