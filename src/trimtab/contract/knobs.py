"""Knobs between a job and the daemon: a knob's declaration when the job registers, a pending change in the
response to a step report, and the job's answer (acknowledged at a step, or refused with a reason).

Each message is a dataclass whose fields carry their kind and meaning (:func:`specs`): the hook builds and reads
them, the API's models are generated from them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Union

from trimtab.contract.kinds import NO_CONTROL_CHARS, NUMBER, Kind, Spec
from trimtab.contract.step_report import MAX_COUNT, RANK, STEP

Number = Union[int, float]

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"  # job, knob and component names: safe in URLs, logs and labels
MAX_JOB_NAME, MAX_NAME = 128, 64                # a job's name; a knob's or a component's
TOKEN_BUDGET_SUFFIX = "_max_tokens"  # a knob named so bounds tokens in flight, not samples (see is_token_budget)
MODES = ("auto", "advise", "off")  # auto: the rebalancer applies changes; advise: it only records; off: nothing
MAX_REASON = 1000  # a refusal's reason, characters

# Knob values: integral ones stay integers (batch sizes, depths); magnitudes a float holds exactly.
KNOB_VALUE = Kind(NUMBER, -1e15, 1e15)
KNOB_NAME = Kind(str, min_length=1, max_length=MAX_NAME, pattern=NAME_PATTERN)
CHANGE_ID = Kind(int, 1, MAX_COUNT, "bigint")
TEXT = Kind(str, storage="text")
REASON = Kind(str, storage="text", min_length=1, max_length=MAX_REASON, pattern=NO_CONTROL_CHARS)


def is_token_budget(knob: str) -> bool:
    """True when ``knob`` is a token budget: its name ends in ``_max_tokens`` (``actor_update_max_tokens``, a verl
    dynamic-batching budget per GPU). Its value is tokens in flight, so the memory a larger value needs grows per
    token whatever the sequences' length; every other batch knob counts samples, whose memory grows with their
    length. The one place this naming rule lives: adapters name their knobs by it, the rebalancer's memory model
    reads it."""
    return knob.endswith(TOKEN_BUDGET_SUFFIX)


def _field(kind: Kind, doc: str, **options: Any):
    return field(metadata={"kind": kind, "doc": doc}, **options)


def specs(message: type) -> tuple[Spec, ...]:
    """The fields of a message class, with their kinds and meanings, in order."""
    return tuple(Spec(f.name, f.metadata["kind"], f.metadata["doc"]) for f in dataclasses.fields(message))


class _Message:
    def to_wire(self) -> dict[str, Any]:
        """The message as JSON takes it: its fields by name."""
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class KnobDeclaration(_Message):
    """A knob as a job declares it: its value and the bounds every change (the rebalancer's or an admin's) must
    stay within. Declared with three integers, it is an integer knob."""

    value: Number = _field(KNOB_VALUE, "The knob's current value in the job (follows applied changes).")
    min: Number = _field(KNOB_VALUE, "Lowest value the rebalancer (or an admin) may set.")
    max: Number = _field(KNOB_VALUE, "Highest value the rebalancer (or an admin) may set.")

    @property
    def integer(self) -> bool:
        return all(isinstance(v, int) and not isinstance(v, bool) for v in (self.value, self.min, self.max))

    @classmethod
    def from_wire(cls, item: Mapping[str, Number]) -> "KnobDeclaration":
        return cls(item["value"], item["min"], item["max"])


@dataclass(frozen=True)
class PendingChange(_Message):
    """A knob change waiting for the job, as the response to a step report carries it: apply it at a step
    boundary on every rank, then acknowledge (or refuse) it by ``change_id``."""

    change_id: int = _field(CHANGE_ID, "Id to acknowledge once applied.")
    knob: str = _field(KNOB_NAME, "The knob to change.")
    value: Number = _field(KNOB_VALUE, "The new value.")
    reason: str = _field(TEXT, "Why (rule or operator note).", default="")

    @classmethod
    def from_wire(cls, item: Any) -> Optional["PendingChange"]:
        """A change from a response, or None when it does not parse. Its value is not trusted either: the job's
        own knobs check it against their bounds before anything applies it."""
        try:
            return cls(int(item["change_id"]), str(item["knob"]), item["value"], str(item.get("reason", "")))
        except (KeyError, TypeError, ValueError, AttributeError):
            return None


@dataclass(frozen=True)
class ChangeAck(_Message):
    """A rank applied a change at a step (``POST /v1/jobs/{name}/acks``)."""

    change_id: int = _field(CHANGE_ID, "The change applied.")
    applied_at_step: int = _field(STEP, "The step at whose start it took effect.")
    rank: int = _field(RANK, "The rank acknowledging (each rank may ack).")


@dataclass(frozen=True)
class ChangeRefusal(_Message):
    """The code that owns a knob on a rank could not apply a change (``POST /v1/jobs/{name}/refusals``)."""

    change_id: int = _field(CHANGE_ID, "The change that could not be applied.")
    rank: int = _field(RANK, "The rank whose knob owner refused it.")
    reason: str = _field(REASON, "Why the code that owns the knob could not apply it (kept with the change and its "
                                 "decision).")

    def to_wire(self) -> dict[str, Any]:
        """As the API takes it: the reason on one printable line, at most MAX_REASON characters, never empty."""
        clean = "".join(ch if ch.isprintable() else " " for ch in str(self.reason))[:MAX_REASON]
        return {**super().to_wire(), "reason": clean or "no reason given"}


KNOB_DECLARATION, PENDING_CHANGE = specs(KnobDeclaration), specs(PendingChange)
ACK, REFUSAL = specs(ChangeAck), specs(ChangeRefusal)
