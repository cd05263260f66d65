"""Knob declarations, pending changes, acks and refusals are defined once: the API's models are made from the
contract's messages, and what the hook sends (or reads) is exactly what those models take (or give)."""

from __future__ import annotations

import pytest

from trimtab.api.job_schemas import AckIn, KnobOut, KnobSpec, PendingChangeOut, RefusalIn
from trimtab.contract.knobs import (ACK, KNOB_DECLARATION, MAX_REASON, PENDING_CHANGE, REFUSAL, ChangeAck,
                                    ChangeRefusal, KnobDeclaration, PendingChange)
from trimtab.trainer.knobs import KnobSet


@pytest.mark.parametrize("model, specs", [(KnobSpec, KNOB_DECLARATION), (KnobOut, KNOB_DECLARATION),
                                          (PendingChangeOut, PENDING_CHANGE), (AckIn, ACK), (RefusalIn, REFUSAL)],
                         ids=lambda x: getattr(x, "__name__", ""))
def test_the_apis_knob_models_are_the_contracts_messages(model, specs):
    assert list(model.model_fields) == [s.name for s in specs]
    assert [f.description for f in model.model_fields.values()] == [s.doc for s in specs]


def test_what_the_hook_declares_and_answers_is_what_the_api_takes():
    declared = KnobSet({"batch_size": (8, 1, 64), "kl_coef": {"value": 0.1, "min": 0.0, "max": 1.0}}).declaration()
    assert declared == {"batch_size": KnobDeclaration(8, 1, 64).to_wire(),
                        "kl_coef": {"value": 0.1, "min": 0.0, "max": 1.0}}
    assert all(KnobSpec.model_validate(spec) for spec in declared.values())
    assert KnobDeclaration.from_wire(declared["batch_size"]).integer and not KnobDeclaration(0.1, 0, 1).integer
    assert AckIn.model_validate(ChangeAck(5, 120, 3).to_wire()).applied_at_step == 120
    refusal = ChangeRefusal(5, 0, "verl\nrefused " + "x" * 2000).to_wire()
    assert RefusalIn.model_validate(refusal).reason.startswith("verl refused") and len(refusal["reason"]) == MAX_REASON
    assert ChangeRefusal(5, 0, "").to_wire()["reason"] == "no reason given"


def test_a_pending_change_reads_back_from_the_response_and_garbage_is_skipped():
    out = PendingChangeOut(change_id=7, knob="batch_size", value=16, reason="generation_bound").model_dump()
    assert PendingChange.from_wire(out) == PendingChange(7, "batch_size", 16, "generation_bound")
    assert PendingChange.from_wire({"change_id": 7, "knob": "prefetch", "value": 2}).reason == ""
    for garbage in ({"knob": "x", "value": 1}, {"change_id": "seven", "knob": "x", "value": 1}, None, [1, 2]):
        assert PendingChange.from_wire(garbage) is None
