"""Every DCGM name /metrics emits, in each dcgm-exporter generation, is one the exporter or DCGM itself names, as
cited in tests/fixtures/dcgm_generations.toml (repository, commit, path and line, or a release note's words), in
the unit the cited row states.

With ``TRIMTAB_DCGM_EXPORTER_GIT`` and ``TRIMTAB_DCGM_GIT`` set to git clones of NVIDIA/dcgm-exporter and
NVIDIA/DCGM, each cited line is read from the cited commit and compared; without them that one test skips, saying
so (the citations are still checked for form and for naming what is emitted).
"""

from __future__ import annotations

import os
import re
import subprocess
import tomllib
from pathlib import Path

import pytest

from trimtab.api.metrics.dcgm_names import DCGM_FIELDS, FB_FREE, GENERATIONS, emitted_names

CITED = tomllib.loads((Path(__file__).parents[2] / "fixtures" / "dcgm_generations.toml").read_text("utf-8"))
SOURCES = CITED["sources"]
GIT_ENV = {"NVIDIA/dcgm-exporter": "TRIMTAB_DCGM_EXPORTER_GIT", "NVIDIA/DCGM": "TRIMTAB_DCGM_GIT"}
UNIT_IN_ROW = {"(in %)": "%", "(in MiB)": "MiB", "(in MHz)": "MHz", "(in W)": "W", "(in C)": "C",
               "in bytes per second": "bytes/s"}


def _collapse(text: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"\s*,\s*", ", ", text)).strip()


def _names_it(entry: dict, name: str) -> bool:
    """The cited words name ``name``: whole, or as ``…_TAIL`` (a reference abbreviating the prefix)."""
    words = entry.get("text") or entry["quote"]
    tail = re.sub(r"^DCGM_FI_(DEV|PROF)", "", name)
    return re.search(rf"(?<![A-Z_]){re.escape(name)}(?![A-Z_])", words) is not None or f"…{tail}" in words


@pytest.mark.parametrize("generation", GENERATIONS)
def test_every_emitted_name_is_cited_and_nothing_else(generation):
    assert sorted(CITED[generation]) == sorted(emitted_names(generation))


@pytest.mark.parametrize("generation", GENERATIONS)
def test_each_citation_names_its_metric_in_a_known_source(generation):
    for name, entry in CITED[generation].items():
        source = SOURCES[entry["source"]]
        if "path" in source:
            assert {"repo", "commit", "path"} <= set(source) and len(source["commit"]) == 40, entry["source"]
            assert isinstance(entry["line"], int) and entry["line"] > 0 and entry["text"], name
        else:
            assert source["url"].startswith("https://") and entry["quote"], name
        assert _names_it(entry, name), (name, entry)


@pytest.mark.parametrize("generation", GENERATIONS)
def test_the_unit_is_the_cited_rows_unit(generation):
    """Where the cited exporter row states a unit, the help text of the emitted series says the same one."""
    notes = {f.named(generation).name: f.named(generation).unit_note for f in DCGM_FIELDS + (FB_FREE,)}
    checked = 0
    for name, entry in CITED[generation].items():
        stated = [unit for words, unit in UNIT_IN_ROW.items() if words in entry.get("text", "")]
        if stated:
            assert f"Unit: {stated[0]}." in notes[name], (name, notes[name])
            checked += 1
    assert checked == (9 if generation == "legacy" else 0)  # the current rows cite DCGM's header and notes


def test_the_current_generation_changes_the_units_the_exporter_changed():
    """4.9.0: utilization % → ratio 0-1, MiB → bytes, MHz → Hz; the rest keep their unit."""
    changed = {f.field: (f.legacy.unit_note, f.current.unit_note) for f in DCGM_FIELDS + (FB_FREE,)
               if f.legacy.unit_note != f.current.unit_note}
    assert changed == {
        "util_pct": ("Unit: %.", "Unit: ratio 0-1, as DCGM."),
        "mem_used_bytes": ("Unit: MiB.", "Unit: bytes."), "mem_reserved_bytes": ("Unit: MiB.", "Unit: bytes."),
        "mem_total_bytes": ("Unit: MiB.", "Unit: bytes."), "mem_free_bytes": ("Unit: MiB.", "Unit: bytes."),
        "sm_clock_mhz": ("Unit: MHz.", "Unit: Hz.")}


def _upstream_line(source: dict, line: int) -> str:
    git = os.environ.get(GIT_ENV[source["repo"]])
    if not git:
        pytest.skip(f"set {GIT_ENV[source['repo']]} to a git clone of {source['repo']} to compare the cited lines")
    text = subprocess.run(["git", "-C", git, "show", f"{source['commit']}:{source['path']}"], check=True,
                          capture_output=True, text=True).stdout  # a clone or a bare mirror
    return text.splitlines()[line - 1]


@pytest.mark.parametrize("generation", GENERATIONS)
def test_each_cited_line_is_the_upstream_files_line(generation):
    for name, entry in CITED[generation].items():
        source = SOURCES[entry["source"]]
        if "path" in source:
            assert _collapse(_upstream_line(source, entry["line"])) == _collapse(entry["text"]), (name, entry)
