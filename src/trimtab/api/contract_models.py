"""Pydantic models made from the contract's field specs (:mod:`trimtab.contract`): a request field takes its
kind's bounds (422 outside them), a response field none (a store holds what older writers wrote too).

The contract defines each message once; these makers turn it into the API's request and response models, so the
JSON Schema and the validation follow the contract without a second copy of its bounds.
"""

from __future__ import annotations

from typing import Annotated, Any, Optional, Union

from pydantic import BaseModel, Field, StringConstraints, create_model

from trimtab.contract.kinds import NO_CONTROL_CHARS, NUMBER, Kind, Spec


def input_type(kind: Kind) -> Any:
    """The type a request field of ``kind`` takes: the kind's bounds in the JSON Schema, 422 outside them. (On a
    union the bounds sit on each member: on the union itself they would not reach the JSON Schema.)"""
    if kind.type is str:
        return Annotated[str, StringConstraints(min_length=kind.min_length, max_length=kind.max_length,
                                                pattern=kind.pattern)]
    if kind.type is dict:
        name = Annotated[str, StringConstraints(min_length=1, max_length=kind.key_max_length,
                                                pattern=NO_CONTROL_CHARS)]
        return dict[name, Annotated[float, Field(ge=kind.ge, le=kind.le)]]
    if kind.type == NUMBER:
        return Union[Annotated[int, Field(ge=int(kind.ge), le=int(kind.le))],
                     Annotated[float, Field(ge=kind.ge, le=kind.le)]]
    return Annotated[kind.type, Field(ge=kind.ge, le=kind.le)]


def output_type(kind: Kind) -> Any:
    """The type a response field of ``kind`` has: no bounds (a store holds what older writers wrote too)."""
    return {NUMBER: Union[int, float], dict: dict[str, float]}.get(kind.type, kind.type)


def contract_field(spec: Spec, inputs: bool, optional: bool) -> tuple[Any, Any]:
    """``(type, Field)`` of one contract field for ``create_model``; an optional one is null when absent (in a
    request: may be left out)."""
    typ = input_type(spec.kind) if inputs else output_type(spec.kind)
    entries = {"max_length": spec.kind.max_length} if inputs and spec.kind.type is dict else {}
    if not optional:
        return typ, Field(description=spec.doc, **entries)
    return Optional[typ], (Field(None, description=spec.doc, **entries) if inputs else
                           Field(description=spec.doc))


def message_model(name: str, specs: Any, doc: str, base: type[BaseModel], inputs: bool,
                  optional: bool = False) -> type[BaseModel]:
    """A request (``inputs``) or response model with one field per spec, in order."""
    fields = {s.name: contract_field(s, inputs, optional) for s in specs}
    return create_model(name, __base__=base, __doc__=doc, **fields)
