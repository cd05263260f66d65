"""What every API schema shares: the bounds of request fields (host names, GPU UUIDs, epoch milliseconds, slugs),
the base of response models and the base of request bodies, and the page and error shapes.

Kept apart from the schemas themselves so each family of schemas (read side, jobs, batches, ledger) builds on one
definition of what a request may hold, and a response model never inherits a request's strictness.
"""

from __future__ import annotations

from typing import Annotated, Any, Optional, Union, get_args

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationInfo, field_validator
from pydantic_core import PydanticCustomError

from trimtab.contract.kinds import NO_CONTROL_CHARS
from trimtab.contract.knobs import NAME_PATTERN

NO_NUL = r"^[^\x00]*$"
MAX_EPOCH_MS = 2**53 - 1  # exact in a JSON number (IEEE double), far inside BIGINT
MAX_INT64 = 2**63 - 1
MAX_INT32 = 2**31 - 1

Hostname = Annotated[str, StringConstraints(min_length=1, max_length=255, pattern=NO_CONTROL_CHARS)]
GpuUuid = Annotated[str, StringConstraints(min_length=1, max_length=96, pattern=NO_CONTROL_CHARS)]
SLUG = NAME_PATTERN  # job names, knob and component names: safe in URLs, logs and Prometheus labels
EVENT_KIND = r"^[a-z][a-z0-9_]*$"
EpochMs = Annotated[int, Field(ge=0, le=MAX_EPOCH_MS)]


class Model(BaseModel):
    """Base of every response model (unknown attributes are ignored: these are built by the server)."""

    model_config = ConfigDict(from_attributes=True)


class InputModel(BaseModel):
    """Base of request bodies: unknown fields are an error (a typo must not pass silently); NaN/∞ never pass;
    a boolean is not a number (pydantic's lax mode would read ``false`` as 0 where the schema says integer)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_booleans_for_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        if _holds_a_boolean(value) and not _may_hold_booleans(cls.model_fields[info.field_name].annotation):
            raise PydanticCustomError("number_type", "Input should be a number, not a boolean (true/false)")
        return value


def _may_hold_booleans(annotation: Any) -> bool:
    """Whether a field of this type may take a bool itself (bool, Any), or leaves that to a nested model."""
    if annotation is bool or annotation is Any:
        return True
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return True  # the nested model checks its own fields
    return any(_may_hold_booleans(arg) for arg in get_args(annotation))


def _holds_a_boolean(value: Any) -> bool:
    if isinstance(value, bool):
        return True
    if isinstance(value, (list, tuple)):
        return any(_holds_a_boolean(v) for v in value)
    if isinstance(value, dict):
        return any(_holds_a_boolean(v) for v in value.values())
    return False


class PageOut(Model):
    """Base of paginated listings."""

    next_offset: Optional[int] = Field(description="Offset of the next page; null on the last page.")


class ErrorOut(Model):
    detail: Union[str, list[dict[str, Any]]] = Field(
        description="What went wrong: a sentence, or (422) a list of {loc, msg, type} naming each invalid field.")

