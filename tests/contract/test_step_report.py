"""The step report is defined once: the hook's wire form, the API's models, the store's columns and the
rebalancer's step view are all made from the contract's list, and a report with every field set survives the
whole way from the hook through the API and the store into the rebalancer's view of its step."""

from __future__ import annotations

import math

from sqlalchemy import JSON, BigInteger, Double, Integer, String

from trimtab.api.job_schemas import GpuPhases, LearningIn, MemoryIn, Phases, ReportIn, ReportOut
from trimtab.contract import step_report as contract
from trimtab.contract.step_report import (BY_RANK, COLUMNS, COUNT_RANKS, GPU_PHASES, GROUPS, LEARNING_KEYS,
                                          MEMORY_KEYS, PHASES, REPORT_FIELDS, SUM, fold_ranks, to_columns, to_wire, top_level)
from trimtab.grading.job_report import job_summary
from trimtab.grading.window import load_steps
from trimtab.store import jobs as job_store
from trimtab.store.models import job_reports
from trimtab.store.steps import STEP_COLUMNS
from trimtab.trainer.step_record import StepReport
from tests.api.conftest import api  # noqa: F401  (the API on each backend)

STORAGE = {"bigint": BigInteger, "integer": Integer, "double": Double, "json": JSON, "text": String}


def example(f: contract.ReportField, i: int):
    """A valid value for field ``f`` (the i-th), distinct from the others' so a mix-up shows."""
    kind = f.kind
    if kind.type is dict:
        return {"loss": 0.5, "reward": -1.0}
    if kind.type is str:
        return "node-a"
    if f.name == "rank":
        return 0
    if f.required and kind.type is float:
        return 60.0  # the step: long enough for every phase
    value = 1 + i if kind.type is int else 0.5 + i / 100
    return min(value, kind.le) if kind.le is not None else value


def full_report() -> StepReport:
    """A hook's report with every field of the contract set."""
    values = {f.column: example(f, i) for i, f in enumerate(REPORT_FIELDS)}
    top = {f.name: values[f.column] for f in top_level()}
    return StepReport(**top, phases_s={p: values[f"{p}_s"] for p in PHASES},
                      gpu_phases_s={p: values[f"gpu_{p}_s"] for p in GPU_PHASES},
                      memory={k: values[k] for k in MEMORY_KEYS} | {"cached_free_fraction": 0.1},
                      learning={k: values[f"learning_{k}"] for k in LEARNING_KEYS})


def test_the_stores_columns_are_the_contracts_fields_with_their_kinds():
    assert STEP_COLUMNS == ("received_ms", *COLUMNS)
    assert [c.name for c in job_reports.columns] == ["id", "job_id", "received_ms", *COLUMNS]
    for f in REPORT_FIELDS:
        column = job_reports.c[f.column]
        assert isinstance(column.type, STORAGE[f.kind.storage]), f.column
        assert column.nullable is not f.required, f.column
    assert job_reports.c.hostname.type.length == contract.HOSTNAME.max_length


def test_the_apis_models_are_the_contracts_fields():
    groups = list(dict.fromkeys(f.group for f in REPORT_FIELDS if f.group))
    assert set(ReportIn.model_fields) == {f.name for f in top_level()} | set(groups) and set(groups) == set(GROUPS)
    assert list(Phases.model_fields) == list(PHASES) and list(MemoryIn.model_fields) == list(MEMORY_KEYS)
    assert list(GpuPhases.model_fields) == list(GPU_PHASES) and list(LearningIn.model_fields) == list(LEARNING_KEYS)
    assert set(ReportOut.model_fields) == {"received_ms", *COLUMNS}
    for f in REPORT_FIELDS:
        model = {"phases": Phases, "gpu_phases": GpuPhases, "memory": MemoryIn,
                 "learning": LearningIn}.get(f.group, ReportIn)
        assert model.model_fields[f.name].description == f.doc
        assert model.model_fields[f.name].is_required() is f.required, f.name


def test_the_wire_form_is_the_contracts_fields_and_nothing_else():
    wire = full_report().to_wire()
    assert set(wire) == {f.name for f in top_level()} | set(GROUPS)
    assert list(wire["phases"]) == list(PHASES) and list(wire["memory"]) == list(MEMORY_KEYS)  # not the local keys
    assert list(wire["gpu_phases"]) == list(GPU_PHASES) and list(wire["learning"]) == list(LEARNING_KEYS)
    assert ReportIn.model_validate(wire).model_dump(exclude_none=True) == wire
    assert set(to_columns(wire)) == set(COLUMNS)


def test_what_the_api_would_refuse_is_clamped_or_left_out_by_the_field_kind():
    wire = to_wire({"step": 2.0, "rank": 1, "step_time_s": math.inf, "samples": -3, "tokens": 2**70,
                    "phases": {"generation": 1e12, "update": "fast", "other": True},
                    "memory": {"fragmentation": 1.5, "num_ooms": 2.6}, "hostname": "bad\nname",
                    "reward_mean": math.nan, "colour": "blue"})
    assert wire == {"step": 2, "rank": 1, "step_time_s": 0.0, "tokens": contract.MAX_COUNT,
                    "phases": {"generation": contract.MAX_SECONDS}, "memory": {"fragmentation": 1.0, "num_ooms": 3}}
    assert to_wire({"step": 0, "rank": 0, "step_time_s": 1.0}) == {"step": 0, "rank": 0, "step_time_s": 1.0,
                                                                    "phases": {}}  # phases always, memory never empty
    assert isinstance(wire["step"], int) and ReportIn.model_validate(wire)


def test_ranks_fold_as_each_field_says():
    rows = [{**{c: None for c in COLUMNS}, "step": 4, "rank": r, "step_time_s": t, "generation_s": g, "samples": 8,
             "total_bytes": total, "collective_latency_us": lat, "pid": 100 + r, "logged": logged}
            for r, t, g, total, lat, logged in ((0, 2.0, 1.5, 80, 10.0, {"loss": 1.0}),
                                                (1, 3.0, 0.5, 40, 30.0, {"loss": 3.0, "kl": 0.1}),
                                                (2, 2.5, None, 60, 20.0, None))]
    folded = fold_ranks(rows)
    assert set(folded) == set(COLUMNS)
    assert (folded["step"], folded["rank"], folded["step_time_s"], folded["generation_s"]) == (4, 3, 3.0, 1.5)
    assert (folded["samples"], folded["total_bytes"], folded["collective_latency_us"]) == (24.0, 40, 20.0)
    assert folded["pid"] == {0: 100, 1: 101, 2: 102} and folded["logged"] == {"kl": 0.1, "loss": 2.0}
    assert folded["fragmentation"] is None and folded["evaluation_s"] is None  # nobody reported it: unknown, not 0


def expected_in_view(f: contract.ReportField, value):
    """What one rank's ``value`` of ``f`` becomes in the step view (a step of one rank): itself, but for the
    count of ranks, a per-rank field (by rank) and a sum (a float)."""
    if f.fold == COUNT_RANKS:
        return 1
    if f.fold == BY_RANK:
        return {0: value}
    return float(value) if f.fold == SUM else value


def test_every_field_survives_hook_to_api_to_store_to_the_rebalancers_step_view(api):
    assert api.post("/v1/jobs", {"name": "contract", "ranks": 1}, scope="job").status_code == 201
    report = full_report()
    wire = report.to_wire()
    assert api.post("/v1/jobs/contract/reports", wire, scope="job").json()["stored"] is True

    (listed,) = api.get("/v1/jobs/contract/reports").json()["reports"]
    assert {k: v for k, v in listed.items() if k != "received_ms"} == to_columns(wire)

    engine = api.ctx.engine
    job = job_store.get_job(engine, "contract")
    (step,) = load_steps(engine, job.id, job.ranks)
    flat = to_columns(wire)
    assert set(step.reported) == set(COLUMNS)
    for f in REPORT_FIELDS:
        assert step.reported[f.column] == expected_in_view(f, flat[f.column]), f.column
    assert (step.step, step.ranks, step.step_time_s, step.samples) == (report.step, 1, 60.0, float(report.samples))
    assert step.phases_s == report.phases_s and step.fragmentation == report.memory["fragmentation"]
    assert step.rl["prompts"] == report.prompts and step.mem_total_bytes == report.memory["total_bytes"]
    # The graded summary reads the same view (one reader for the controller and for check / /metrics).
    assert job_summary(engine, job).window_steps == [report.step, report.step]
