"""Where the agent's batches go: the :class:`Sink` protocol every destination implements, and the three ways a
destination says no. It sits in the contract because the agent (the writer, the HTTP sink in
``trimtab.agent.sinks``) and the store (``trimtab.store.sink``) both implement or drive it; stdlib only.

A sink says "not now" by raising :class:`SinkUnavailable` (the writer then spools and retries), "never, as
configured" by raising :class:`SinkMisconfigured` (the writer keeps what it has on disk, says so once and reports
itself failed: a database that does not exist, a refused token); any other exception (:class:`BatchRefused` from
the HTTP sink) means the batch itself was refused, and the writer keeps it aside instead of retrying forever.
"""

from __future__ import annotations

from typing import Protocol

from trimtab.contract.readings import Batch

__all__ = ["BatchRefused", "Sink", "SinkMisconfigured", "SinkUnavailable"]


class SinkUnavailable(RuntimeError):
    """The destination cannot be reached right now; try again later."""


class SinkMisconfigured(RuntimeError):
    """The destination refuses this agent as configured (wrong database, schema, credentials or token): waiting
    cannot help, only fixing the configuration does. The message says what to fix."""


class Sink(Protocol):
    description: str

    def write(self, batch: Batch) -> int:
        """Write one batch; return the rows newly stored. Raise SinkUnavailable when the destination is down."""
        ...

    def maintenance(self, now_ms: int) -> None:
        """The store's upkeep (rollups, retention) where the sink owns a store and it is due; may do nothing.
        The writer calls it on every cycle while the sink is up."""
        ...

    def close(self) -> None: ...


class BatchRefused(RuntimeError):
    """The server answered that this batch will never be accepted (bad token, invalid, too large)."""
