"""The whole import order of the package, stated once and checked on every import line (read with ast, also those
inside functions; relative imports resolved):

    contract  <-  agent, trainer, store  <-  grading  <-  control  <-  api  <-  cli (+ daemon, config, sdnotify)

A part may import the parts of lower levels, never one of its own level or above. Besides the levels:

* ``trimtab.paths`` (the state directory, token files, exit codes: stdlib only) may be imported by every part;
* the daemon wiring modules ``trimtab.daemon``, ``trimtab.config`` and ``trimtab.sdnotify`` sit with the cli, and
  import no other part (the daemon: sdnotify); the cli imports them and every lower level;
* the torch side stays apart: ``trimtab.workload`` (the reference workload) imports ``trimtab.trainer`` and the
  contract only, nothing of the daemon imports ``trimtab.trainer`` or ``trimtab.workload`` (the cli does, inside the
  functions of its ``demo``/``verl-tail`` commands), ``trimtab.trainer`` imports no daemon code, and neither the
  daemon, the contract nor the torch-free corners of the trainer import torch when their modules load;
* the store is sealed: outside ``trimtab.store`` nothing builds SQL or imports its tables (an engine is passed
  around as an opaque handle, and SQLAlchemy's exceptions may be caught);
* the contract imports only itself and the standard library.

A folder this file names that does not exist fails, and so does a module in a part this file does not place: the
scan cannot pass by reading nothing. ``test_the_checker_reports_a_planted_wrong_way_import`` plants arrows against the
order in a copy of the tree and checks that each is reported.
"""

from __future__ import annotations

import ast
import json
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"

LEVELS = (
    ("contract",),
    ("agent", "trainer", "store"),
    ("grading",),
    ("control",),
    ("api",),
    ("cli", "daemon", "config", "sdnotify"),
)
# The daemon wiring modules import no other part (paths and the root package aside): the daemon's run loop uses
# sd_notify, configuration reading and sd_notify stand alone. The cli imports them and every lower level.
WIRING_MAY_IMPORT = {"daemon": {"sdnotify"}, "config": set(), "sdnotify": set()}
SHARED = {"paths"}                       # stdlib only, importable from every part
TORCH_SIDE = {"trainer", "workload"}     # the in-job library and the reference workload
WORKLOAD_MAY_IMPORT = {"trainer", "contract"}
DAEMON = {"agent", "store", "grading", "control", "api", "cli", "daemon", "config", "sdnotify", "paths"}
# Modules that load without torch (the daemon, the contract, and the trainer's package and log tailer: a training
# environment's `trimtab verl-tail` runs without torch, tests/trainer/test_verl_tail_no_torch.py).
NO_TORCH_MODULES = ("trimtab.trainer", "trimtab.trainer.adapters", "trimtab.trainer.adapters.verl")
TORCH = {"torch", "numpy"}
SQL_MAY_IMPORT = {"sqlalchemy": {"Engine"}, "sqlalchemy.engine": {"Engine"}}  # and anything from sqlalchemy.exc
SQL_SCANNED_OUTSIDE_SRC = ("grafana",)

# Arrows against the order that the code has today, each with its reason; keyed by (importing module, imported
# module) so that any other arrow of the same kind still fails. An entry that no longer matches an import fails
# too (remove it when the code is fixed).
KNOWN_EXCEPTIONS = {
    ("trimtab.grading.rules_parse", "trimtab.config"):
        "rules.toml is parsed with trimtab.config's parse_toml/read_toml_text/ConfigError (inside functions); the "
        "TOML reading belongs below grading (or in paths) for grading to stand on its own",
}


@dataclass(frozen=True)
class Import:
    where: str          # importing module, e.g. trimtab.store.sink
    module: str         # imported module, resolved, e.g. trimtab.agent.sinks
    names: frozenset    # names of a `from ... import`, empty for `import x`
    at_load: bool       # at module level (not inside a function)
    line: int

    def __str__(self):
        return f"{self.where}:{self.line} imports {self.module}" + (
            f" ({', '.join(sorted(self.names))})" if self.names else "")


def module_name(path: Path, top: Path) -> str:
    parts = list(path.relative_to(top).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def read_imports(path: Path, name: str) -> list[Import]:
    """Every import in the file, also inside functions; `from . import x` and `from .x import y` resolved."""
    tree = ast.parse(path.read_text(), str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    in_function = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            in_function.update(id(inner) for inner in ast.walk(node) if inner is not node)
    out = []
    for node in ast.walk(tree):
        at_load = id(node) not in in_function
        if isinstance(node, ast.Import):
            out += [Import(name, alias.name, frozenset(), at_load, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module
            names = frozenset(alias.name for alias in node.names)
            if not node.module:       # `from . import x`: each name is a module of the package
                out += [Import(name, f"{module}.{n}", frozenset(), at_load, node.lineno) for n in names]
            elif module == "trimtab" and names - {"__version__"}:   # `from trimtab import paths`
                out += [Import(name, f"trimtab.{n}", frozenset(), at_load, node.lineno) for n in names]
            else:
                out.append(Import(name, module, names, at_load, node.lineno))
    return out


def scan(top: Path) -> dict[str, list[Import]]:
    """{module: its imports} for every module of the ``trimtab`` package under ``top`` (a ``src`` folder)."""
    package = top / "trimtab"
    assert package.is_dir(), f"no folder {package}"
    found = {module_name(p, top): read_imports(p, module_name(p, top)) for p in sorted(package.rglob("*.py"))}
    assert found, f"no modules under {package}"
    return found


def part(module: str) -> str:
    """trimtab.store.sink -> store; trimtab -> '' (the root package: the version, shared by all)."""
    return module.split(".")[1] if module.count(".") else ""


LEVEL = {p: i for i, names in enumerate(LEVELS) for p in names}
PLACED = set(LEVEL) | SHARED | {"workload", "deploy"}   # deploy: unit files and their package marker


def may_import(importer: str, imported: str) -> bool:
    """Whether part ``importer`` may import part ``imported`` (the order in the module docstring)."""
    if imported in ("", importer) or imported in SHARED:
        return True
    if importer in SHARED:
        return False
    if importer == "workload":
        return imported in WORKLOAD_MAY_IMPORT
    if imported == "workload":
        return importer == "cli"
    if importer in WIRING_MAY_IMPORT:
        return imported in WIRING_MAY_IMPORT[importer]
    if importer == "cli" and imported in WIRING_MAY_IMPORT:
        return True
    if importer not in LEVEL or imported not in LEVEL:
        return False
    if imported in TORCH_SIDE and importer in DAEMON and importer != "cli":
        return False
    if importer in TORCH_SIDE and imported in DAEMON:
        return False
    return LEVEL[imported] < LEVEL[importer]


def wrong_way(found: dict[str, list[Import]]) -> list[Import]:
    """Every import of a trimtab module against the order, known exceptions included."""
    bad = []
    for where, imports in found.items():
        for imp in imports:
            if imp.module == "trimtab" or imp.module.startswith("trimtab."):
                if not may_import(part(where), part(imp.module)):
                    bad.append(imp)
                elif part(where) == "cli" and part(imp.module) in TORCH_SIDE and imp.at_load:
                    bad.append(imp)   # the cli reaches the torch side only inside a command's function
    return bad


def unplaced(found: dict[str, list[Import]]) -> list[str]:
    return sorted({part(m) for m in found if part(m) and part(m) not in PLACED})


def loads_torch(found: dict[str, list[Import]], start: str) -> list[str]:
    """The chain of module-level imports by which loading ``start`` loads torch/numpy, or []."""
    seen, stack = {start}, [[start]]
    while stack:
        chain = stack.pop()
        imports = list(found.get(chain[-1], []))
        for parent in _parents(chain[-1]):           # importing a.b.c runs a/__init__ and a/b/__init__ first
            imports += found.get(parent, [])
        for imp in imports:
            if not imp.at_load:
                continue
            if imp.module.split(".")[0] in TORCH:
                return chain + [imp.module]
            targets = [imp.module] + [f"{imp.module}.{n}" for n in imp.names]
            for target in targets:
                if target in found and target not in seen:
                    seen.add(target)
                    stack.append(chain + [target])
    return []


def _parents(module: str) -> list[str]:
    bits = module.split(".")
    return [".".join(bits[:i]) for i in range(1, len(bits))]


def sql_leaks(found: dict[str, list[Import]]) -> list[Import]:
    leaks = []
    for where, imports in found.items():
        if part(where) == "store":
            continue
        for imp in imports:
            tables = imp.module == "trimtab.store.models" or (imp.module == "trimtab.store" and "models" in imp.names)
            sql = imp.module.split(".")[0] == "sqlalchemy" and imp.module != "sqlalchemy.exc" \
                and not (imp.names and imp.names <= SQL_MAY_IMPORT.get(imp.module, set()))
            if tables or sql:
                leaks.append(imp)
    return leaks


# --- the package as it is ------------------------------------------------------------------------------------------

FOUND = scan(SRC)


def test_every_part_named_here_exists_and_every_part_is_placed():
    missing = [p for p in (*LEVEL, *SHARED, "workload")
               if not (SRC / "trimtab" / p).is_dir() and not (SRC / "trimtab" / f"{p}.py").is_file()]
    assert not missing, f"parts named in tests/test_layers.py that src/trimtab lacks: {missing}"
    assert not unplaced(FOUND), f"parts of src/trimtab that tests/test_layers.py does not place: {unplaced(FOUND)}"
    for p in LEVEL:
        assert any(part(m) == p for m in FOUND), f"no module of trimtab.{p} was read"


def test_no_import_runs_against_the_order():
    bad = [imp for imp in wrong_way(FOUND) if (imp.where, imp.module) not in KNOWN_EXCEPTIONS]
    assert not bad, "imports against contract <- agent, trainer, store <- grading <- control <- api <- cli:\n" + \
        "\n".join(map(str, bad))


def test_each_known_exception_is_still_in_the_code():
    present = {(imp.where, imp.module) for imp in wrong_way(FOUND)}
    stale = [key for key in KNOWN_EXCEPTIONS if key not in present]
    assert not stale, f"fixed in the code; remove from KNOWN_EXCEPTIONS in tests/test_layers.py: {stale}"


def test_nothing_outside_the_store_builds_sql_or_imports_its_tables():
    found = dict(FOUND)
    for folder in SQL_SCANNED_OUTSIDE_SRC:
        assert (ROOT / folder).is_dir(), f"no folder {ROOT / folder}"
        for path in sorted((ROOT / folder).rglob("*.py")):
            name = f"{folder}.{module_name(path, ROOT / folder)}"
            found[name] = read_imports(path, name)
    leaks = sql_leaks(found)
    assert not leaks, "\n".join(map(str, leaks))


def test_the_contract_paths_and_sdnotify_import_only_themselves_and_the_standard_library():
    stdlib = set(sys.stdlib_module_names) | {"__future__"}
    foreign = [str(imp) for where, imports in FOUND.items() if part(where) in ("contract", "paths", "sdnotify")
               for imp in imports if not imp.module.startswith(f"trimtab.{part(where)}")
               and imp.module.split(".")[0] not in stdlib]
    assert not foreign, "\n".join(foreign)


def test_the_daemon_and_the_torch_free_trainer_modules_load_without_torch():
    starts = [m for m in FOUND if part(m) in DAEMON | {"contract"}] + list(NO_TORCH_MODULES)
    for m in NO_TORCH_MODULES:
        assert m in FOUND, f"no module {m}"
    chains = [" -> ".join(chain) for chain in map(lambda m: loads_torch(FOUND, m), starts) if chain]
    assert not chains, "\n".join(chains)


# --- the checker itself -------------------------------------------------------------------------------------------

PLANTS = {
    # file (under src/trimtab), line appended, the arrow it must be reported as
    "store/events.py": ("from trimtab.api.app import create_app\n", ("trimtab.store.events", "trimtab.api.app")),
    "contract/kinds.py": ("def f():\n    import trimtab.agent.sinks\n",
                          ("trimtab.contract.kinds", "trimtab.agent.sinks")),
    "grading/balance.py": ("from trimtab.control import controller\n",
                           ("trimtab.grading.balance", "trimtab.control")),
    "agent/host.py": ("import trimtab.trainer.hook\n", ("trimtab.agent.host", "trimtab.trainer.hook")),
    "workload/streams.py": ("from ..store import events\n", ("trimtab.workload.streams", "trimtab.store")),
    "cli/verl_cmd.py": ("from trimtab.workload import story\n", ("trimtab.cli.verl_cmd", "trimtab.workload")),
    "trainer/report.py": ("from trimtab.daemon import serve\n", ("trimtab.trainer.report", "trimtab.daemon")),
    "paths.py": ("from trimtab.config import parse_toml\n", ("trimtab.paths", "trimtab.config")),
    "config.py": ("def f():\n    from trimtab.store.engine import open_engine\n",
                  ("trimtab.config", "trimtab.store.engine")),
}


def test_the_checker_reports_a_planted_wrong_way_import(tmp_path):
    copy = tmp_path / "src"
    shutil.copytree(SRC / "trimtab", copy / "trimtab", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for rel, (line, _) in PLANTS.items():
        with open(copy / "trimtab" / rel, "a") as f:
            f.write("\n" + line)
    found = scan(copy)
    reported = {(imp.where, imp.module) for imp in wrong_way(found)}
    for rel, (_, arrow) in PLANTS.items():
        assert arrow in reported, f"planted {arrow} in {rel} was not reported"
    # and nothing but the plants and what the tree itself has
    assert reported - {a for _, a in PLANTS.values()} == {(imp.where, imp.module) for imp in wrong_way(FOUND)}


def test_the_checker_reports_sql_torch_and_an_unplaced_part(tmp_path):
    found = {
        "trimtab.api.leak": [Import("trimtab.api.leak", "sqlalchemy", frozenset({"select"}), False, 3),
                             Import("trimtab.api.leak", "trimtab.store.models", frozenset(), True, 1)],
        "trimtab.api.ok": [Import("trimtab.api.ok", "sqlalchemy.exc", frozenset({"DBAPIError"}), True, 1),
                           Import("trimtab.api.ok", "sqlalchemy", frozenset({"Engine"}), True, 2)],
        "trimtab.grading.heavy": [Import("trimtab.grading.heavy", "trimtab.grading.util", frozenset(), True, 1)],
        "trimtab.grading.util": [Import("trimtab.grading.util", "numpy", frozenset(), True, 1)],
        "trimtab.newpart.x": [],
    }
    assert [str(i) for i in sql_leaks(found)] == ["trimtab.api.leak:3 imports sqlalchemy (select)",
                                                  "trimtab.api.leak:1 imports trimtab.store.models"]
    assert loads_torch(found, "trimtab.grading.heavy") == ["trimtab.grading.heavy", "trimtab.grading.util", "numpy"]
    assert unplaced(found) == ["newpart"]
    with pytest.raises(AssertionError, match="no folder"):
        scan(tmp_path / "nowhere")


def test_the_scan_sees_imports_inside_functions_and_resolves_relative_ones(tmp_path):
    probe = tmp_path / "trimtab" / "workload" / "probe.py"
    probe.parent.mkdir(parents=True)
    probe.write_text("from .loop import Pipeline\nfrom .. import paths\n"
                     "def f():\n    from sqlalchemy import select\n    import trimtab.store.models\n")
    got = [(i.module, set(i.names), i.at_load) for i in read_imports(probe, "trimtab.workload.probe")]
    assert got == [("trimtab.workload.loop", {"Pipeline"}, True), ("trimtab.paths", set(), True),
                   ("sqlalchemy", {"select"}, False), ("trimtab.store.models", set(), False)]


# --- the trainer without the server stack, at run time (a training environment needs torch and httpx only) --------

BLOCKED = ("fastapi", "starlette", "uvicorn", "pydantic", "sqlalchemy", "alembic", "psycopg")

BLOCKER = """
import json, sys

BLOCKED = {blocked!r}


class Blocker:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError(f"blocked by the test: {{name}}")
        return None


sys.meta_path.insert(0, Blocker())
"""

PROBE = BLOCKER + """
import trimtab.trainer
import trimtab.trainer.adapters.hf
import trimtab.trainer.adapters.lightning
import trimtab.trainer.adapters.verl
import trimtab.trainer.adapters.verl_knobs

hook = trimtab.trainer.attach("isolated", "http://127.0.0.1:9", "tok", knobs={{"batch_size": (2, 1, 4)}})
with hook.phase("generation"):
    pass
hook.step_end(samples=2)
hook.close(timeout_s=0.2)
print(json.dumps({{"leaked": sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED),
                  "torch": "torch" in sys.modules, "httpx": "httpx" in sys.modules}}))
"""


def test_the_trainer_package_imports_and_runs_without_the_server_stack():
    out = subprocess.run([sys.executable, "-c", PROBE.format(blocked=BLOCKED)], capture_output=True, text=True,
                         timeout=60, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {"leaked": [], "torch": True, "httpx": True}


CONTRACT_PROBE = BLOCKER + """
import trimtab.contract.knobs
import trimtab.contract.step_report

print(json.dumps(sorted(m for m in sys.modules if m.startswith("trimtab"))))
"""


def test_the_contract_the_hook_shares_with_the_daemon_needs_neither_torch_nor_the_server_stack():
    blocked = (*BLOCKED, "torch", "numpy", "httpx")
    out = subprocess.run([sys.executable, "-c", CONTRACT_PROBE.format(blocked=blocked)], capture_output=True,
                         text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    loaded = json.loads(out.stdout.strip().splitlines()[-1])
    assert [m for m in loaded if m != "trimtab" and not m.startswith("trimtab.contract")] == []
