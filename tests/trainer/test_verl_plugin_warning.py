"""The verl plugin never raises into verl's plugin loader (which logs a plugin that fails at DEBUG only, so nobody
would see it) and says, in exactly one WARNING line in the process that runs ``fit``, why trimtab is not attached:
trimtab's own parts failed to import when verl loaded the plugin, failed to import when ``fit`` started, or the run
names no server. verl 0.9.1's real V1 fit loop runs in each case (``tests/trainer/verl_harness.py`` says what is
stubbed: the GPU work)."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.support.frameworks import require

require("verl")

from tests.trainer.verl_v1_sync_harness import run_v1_fit  # noqa: E402

pytestmark = pytest.mark.usefixtures("verl_ray")
ROOT = Path(__file__).resolve().parents[2]
PLUGIN = "trimtab.trainer.adapters.verl_plugin"

# A fresh interpreter, so that verl's own loader (verl/__init__.py) imports the entry point: one of trimtab's
# modules is broken (None in sys.modules: importing it raises ImportError, as a half-upgraded install would), then
# verl's real V1 fit runs with a server named. Every log record is kept; the result goes out as JSON.
CHILD = textwrap.dedent("""
    import json, logging, sys
    records = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record)

    logging.getLogger().addHandler(Keep(level=logging.DEBUG))
    logging.getLogger("verl").setLevel(logging.DEBUG)  # the loader's "Failed to load plugin" line, were it raised
    sys.modules[BROKEN] = None
    import verl  # verl's loader: every verl.plugins entry point
    loaded = PLUGIN in sys.modules  # a module that raised while loading is taken out of sys.modules
    from tests.trainer.verl_harness import shutdown
    from tests.trainer.verl_v1_sync_harness import run_v1_fit
    try:
        run = run_v1_fit(TMP, steps=2, overrides=["+trimtab.server=http://127.0.0.1:9"])
        steps = sorted(r["step"] for r in run.records if "timing_s/step" in r["data"])
    finally:
        shutdown()
    print("RESULT " + json.dumps({
        "loaded": loaded, "steps": steps,
        "loader": [r.getMessage() for r in records if r.name == "verl" and "plugin" in r.getMessage()],
        "warnings": [(r.name, r.levelname, r.getMessage(), r.exc_info is not None) for r in records
                     if r.name.startswith("trimtab") and r.levelno >= logging.WARNING]}))
""")


def test_a_trimtab_that_fails_to_import_never_raises_into_verls_loader_and_says_why_in_one_warning_line_at_fit(
        tmp_path):
    broken = "trimtab.trainer.adapters.verl_staleness"
    script = f"BROKEN, PLUGIN, TMP = {broken!r}, {PLUGIN!r}, {str(tmp_path)!r}\n" + CHILD
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    env.pop("VERL_USE_EXTERNAL_PLUGINS", None)  # verl's default: load every entry point
    for var in ("TRIMTAB_SERVER", "TRIMTAB_TOKEN", "TRIMTAB_TOKEN_FILE"):
        env.pop(var, None)
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=540)
    line = next((x for x in done.stdout.splitlines() if x.startswith("RESULT ")), None)
    assert done.returncode == 0 and line, done.stderr[-4000:]
    got = json.loads(line[len("RESULT "):])
    print(got)
    assert got["loaded"] and got["loader"] == []  # verl's loader saw no exception
    assert got["steps"] == [1, 2]  # training went on
    (warning,) = got["warnings"]  # exactly one, in this process (the one that ran fit)
    name, level, message, traceback = warning
    assert level == "WARNING" and not traceback and "\n" not in message
    assert message == (f"trimtab: not attached to verl's PPOTrainerSync fit(): trimtab failed to import "
                       f"(ModuleNotFoundError: import of {broken} halted; None in sys.modules); training continues "
                       f"without trimtab")


def trimtab_warnings(caplog) -> list:
    return [r for r in caplog.records if r.name.startswith("trimtab") and r.levelno >= logging.WARNING]


def test_a_trimtab_that_fails_to_import_when_fit_starts_says_why_in_one_warning_line(tmp_path, caplog, monkeypatch):
    """The plugin loaded; the hook's link to the server cannot be imported when ``fit`` starts to attach."""
    monkeypatch.setitem(sys.modules, "trimtab.trainer.server_link", None)
    monkeypatch.delitem(sys.modules, "trimtab.trainer.hook", raising=False)  # imported again, so it meets it
    with caplog.at_level(logging.DEBUG, logger="trimtab"):
        run = run_v1_fit(tmp_path, steps=2, overrides=["+trimtab.server=http://127.0.0.1:9"])
    assert sorted(r["step"] for r in run.records if "timing_s/step" in r["data"]) == [1, 2]
    (warning,) = trimtab_warnings(caplog)
    assert warning.exc_info is None and warning.getMessage() == (
        "trimtab: not attached to verl's PPOTrainerSync fit(): trimtab failed to import (ModuleNotFoundError: "
        "import of trimtab.trainer.server_link halted; None in sys.modules); training continues without trimtab")


def test_a_verl_run_that_names_no_server_says_so_in_one_warning_line(tmp_path, caplog, monkeypatch):
    for var in ("TRIMTAB_SERVER", "TRIMTAB_TOKEN", "TRIMTAB_TOKEN_FILE"):
        monkeypatch.delenv(var, raising=False)
    with caplog.at_level(logging.WARNING, logger="trimtab"):
        run = run_v1_fit(tmp_path, steps=2)
    assert sorted(r["step"] for r in run.records if "timing_s/step" in r["data"]) == [1, 2]
    (warning,) = trimtab_warnings(caplog)
    assert warning.getMessage() == (
        "trimtab: not attached to verl's PPOTrainerSync fit(): no server named (+trimtab.server=URL on verl's "
        "command line, or TRIMTAB_SERVER); training continues without trimtab")
