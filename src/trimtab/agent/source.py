"""The one protocol every metric source implements (NVML, host, simulated node).

The sampler knows only this protocol. A source must never raise out of ``sample`` for a problem with one GPU or
one metric: it returns what it could read, ``None`` for the rest, and a ``HealthEvent`` saying what went wrong.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Protocol, runtime_checkable

from trimtab.contract.readings import GpuInfo, Readings


@dataclass(frozen=True)
class Inventory:
    """What a source found at start: its GPUs and the facts that describe the node."""

    gpus: list[GpuInfo] = field(default_factory=list)
    simulated: bool = False
    driver_version: Optional[str] = None
    nvml_version: Optional[str] = None
    scenario: Optional[str] = None


class SourceUnavailable(RuntimeError):
    """The source cannot run on this machine (e.g. no NVIDIA driver). The message says what to do instead."""


@runtime_checkable
class Source(Protocol):
    """A metric source. ``kind`` is "nvml", "host" or "simulated"."""

    kind: str

    def inventory(self) -> Inventory:
        """Static facts, read once at start (cheap to call again)."""
        ...

    def sample(self, ts_ms: int) -> Readings:
        """Read everything for one tick, stamped ``ts_ms`` (epoch milliseconds). Must not block for long."""
        ...

    def close(self) -> None:
        """Release handles and stop any background thread."""
        ...
