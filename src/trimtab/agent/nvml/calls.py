"""The thin call layer over NVML: the only module in trimtab that imports ``pynvml`` (package ``nvidia-ml-py``),
and the one place that turns an NVML error into an answer.

* NOT_SUPPORTED, or a function missing from the bindings or the driver (FUNCTION_NOT_FOUND): **unsupported** —
  remembered per (GPU, metric) and never asked again; a later variant of the call is tried first, if named.
* GPU_IS_LOST: the GPU is **lost** — retired with one health event, and :class:`GpuLost` ends its work this tick.
* Anything else: **failed** — ``None`` this time, and one health event per (GPU, metric, error), not one a tick.

The tick's own calls are made straight through the bindings (see ``trimtab.agent.nvml.tick``) and come here only
when they raise; everything else (start-up, the slow thread, XID polls) calls through :meth:`NvmlCalls.call`.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Optional, Protocol

from trimtab.contract.readings import EVENT_GPU_LOST, EVENT_SOURCE_ERROR, GpuInfo, HealthEvent
from trimtab.agent.source import SourceUnavailable

# What the agent says where there is no driver (commands other than `agent` say their own).
NO_DRIVER_HINT = "Run `trimtab agent --simulate N` for a simulated node on a machine without NVIDIA GPUs."
_NO_DRIVER_CODES = (9, 12)  # NVML_ERROR_DRIVER_NOT_LOADED, NVML_ERROR_LIBRARY_NOT_FOUND

OnCall = Callable[[str, float], None]


class GpuLost(Exception):
    """A call reported GPU_IS_LOST: the GPU is retired (one event said so); ends that GPU's work for this tick."""


class Device(Protocol):
    """What the call layer needs to know of a GPU: its index, its facts, and whether it is lost."""

    index: int
    info: GpuInfo
    lost: bool


def load_pynvml() -> Any:
    """Import ``pynvml`` (lazily, so importing trimtab never needs a driver). Missing → ``SourceUnavailable``."""
    try:
        import pynvml
    except ImportError as exc:
        raise SourceUnavailable(f"The NVML bindings are not installed ({exc}); `pip install nvidia-ml-py`. "
                                + NO_DRIVER_HINT) from None
    return pynvml


class NvmlCalls:
    """NVML for one source: initialised by :meth:`start`, with the bookkeeping of what is unsupported, what was
    said, and the health events waiting for the next tick. Thread-safe where two threads meet (the tick and the
    slow thread): the event queue and the once-only sets."""

    def __init__(self, nv: Any):
        self.nv = nv
        self._lock = threading.Lock()
        self._pending: list[tuple[str, str, Optional[str], Optional[int]]] = []  # kind, detail, uuid, xid
        self._unsupported: set[tuple[Optional[int], str]] = set()  # (gpu index, metric): never asked again
        self._reported: set[tuple[Optional[int], str, Any]] = set()  # (gpu index, metric, error): said once
        self._variant: dict[tuple[Optional[int], str], Any] = {}  # (gpu index, metric) → the function that works
        # The codes after which a later variant of a call is worth trying (and which mean "unsupported" at the end).
        self._absent = (nv.NVML_ERROR_FUNCTION_NOT_FOUND, nv.NVML_ERROR_NOT_SUPPORTED)

    def start(self) -> None:
        nv = self.nv
        try:
            nv.nvmlInit()
        except nv.NVMLError as exc:
            hint = "no NVIDIA driver found" if exc.value in _NO_DRIVER_CODES else "NVML failed to start"
            raise SourceUnavailable(f"NVML unavailable: {hint} ({exc}). {NO_DRIVER_HINT}") from None

    def functions(self, names: Any) -> list[Any]:
        """The bindings' functions for ``names`` (one name, a tuple of names in order of preference, or a
        callable), leaving out the names these bindings lack."""
        if callable(names):
            return [names]
        found = (getattr(self.nv, name, None) for name in ((names,) if isinstance(names, str) else names))
        return [fn for fn in found if fn is not None]

    # --- answers ------------------------------------------------------------------------------------------

    def mark_unsupported(self, gpu: Optional[Device], metric: str) -> None:
        self._unsupported.add((gpu.index if gpu else None, metric))

    def failed(self, gpu: Optional[Device], metric: str, exc: BaseException, quiet: tuple = ()) -> bool:
        """What an exception from an NVML call means: True when ``metric`` is now unsupported for ``gpu`` (the
        caller stops asking). GPU_IS_LOST retires the GPU and raises :class:`GpuLost`; any other error is
        reported once. ``quiet``: codes that are expected answers (nothing remembered, nothing said)."""
        code = getattr(exc, "value", None) if isinstance(exc, self.nv.NVMLError) else None
        if code in quiet:
            return False
        if code in self._absent:
            self.mark_unsupported(gpu, metric)
            return True
        if code == self.nv.NVML_ERROR_GPU_IS_LOST and gpu is not None:
            self.retire(gpu)
            raise GpuLost(gpu.info.uuid)
        # NVMLLibraryMismatchError, ctypes errors, other NVML codes: a metric must not end the tick
        self.report_once(gpu, metric, code if code is not None else type(exc).__name__, exc)
        return False

    def value_failed(self, gpu: Device, metric: str, ret: int) -> bool:
        """The same for a return code carried inside a result (a GPM metric, a field value): True when
        unsupported (remembered); any other code is reported once."""
        if ret == self.nv.NVML_ERROR_NOT_SUPPORTED:
            self.mark_unsupported(gpu, metric)
            return True
        self.report_once(gpu, metric, ret, f"NVML error {ret}")
        return False

    # --- the cold path ------------------------------------------------------------------------------------

    def call(self, gpu: Optional[Device], metric: str, func: Any, *args: Any, quiet: tuple = (),
             on_call: Optional[OnCall] = None, **kwargs: Any) -> Any:
        """Call NVML (a function name, a tuple of names to try in order, or a callable); the value or ``None``.

        A later name in a tuple is tried when an earlier one is missing from the bindings or the driver, or
        NOT_SUPPORTED; the one that works is remembered. Raises :class:`GpuLost` after retiring the GPU.
        ``on_call(metric, seconds)`` is timed around the call when given.
        """
        key = (gpu.index if gpu else None, metric)
        if key in self._unsupported:
            return None
        fns = [self._variant[key]] if key in self._variant else self.functions(func)
        failure: Optional[BaseException] = None
        for fn in fns:
            try:
                value = fn(*args, **kwargs) if on_call is None else timed(on_call, metric, fn)(*args, **kwargs)
            except Exception as exc:  # noqa: BLE001 - sorted out by failed() below
                failure = exc
                if isinstance(exc, self.nv.NVMLError) and exc.value in self._absent:
                    continue
                break
            if len(fns) > 1:
                self._variant[key] = fn
            return value
        if failure is None:  # no function of that name in these bindings
            self.mark_unsupported(gpu, metric)
            return None
        self.failed(gpu, metric, failure, quiet)
        return None

    # --- events -------------------------------------------------------------------------------------------

    def report_once(self, gpu: Optional[Device], metric: str, what: Any, error: Any) -> None:
        key = (gpu.index if gpu else None, metric, what)
        with self._lock:
            if key in self._reported:
                return
            self._reported.add(key)
        where = f"GPU {gpu.index}" if gpu else "NVML"
        self.emit(EVENT_SOURCE_ERROR, f"{where}: reading {metric} failed: {error} (reported once)",
                  gpu.info.uuid if gpu else None)

    def retire(self, gpu: Device) -> None:
        with self._lock:
            if gpu.lost:
                return
            gpu.lost = True
        self.emit(EVENT_GPU_LOST, f"GPU {gpu.index} is lost (NVML GPU_IS_LOST); no longer sampled", gpu.info.uuid)

    def emit(self, kind: str, detail: str, gpu_uuid: Optional[str], xid: Optional[int] = None) -> None:
        with self._lock:
            self._pending.append((kind, detail, gpu_uuid, xid))

    def take_events(self, ts_ms: int) -> list[HealthEvent]:
        """The events raised since the last call, stamped ``ts_ms``."""
        if not self._pending:  # the common tick; an event appended meanwhile is taken by the next one
            return []
        with self._lock:
            pending, self._pending = self._pending, []
        return [HealthEvent(ts_ms=ts_ms, kind=k, detail=d, gpu_uuid=u, xid=x) for k, d, u, x in pending]

    def unsupported(self) -> list[tuple[Optional[int], str]]:
        """(GPU index or None, metric) pairs that answered NOT_SUPPORTED and are no longer asked."""
        return sorted(self._unsupported, key=str)

    def shutdown(self) -> None:
        try:
            self.nv.nvmlShutdown()
        except self.nv.NVMLError:
            pass


def timed(on_call: OnCall, metric: str, fn: Callable) -> Callable:
    """``fn`` with ``on_call(metric, seconds)`` timed around each call (for benches; the plain tick has no hook)."""
    import time

    perf = time.perf_counter

    def call(*args: Any, **kwargs: Any) -> Any:
        started = perf()
        try:
            return fn(*args, **kwargs)
        finally:
            on_call(metric, perf() - started)

    return call
