"""The store is sealed: outside store/ nothing builds SQL or imports its tables (an engine is passed around as an
opaque handle, and SQLAlchemy's exceptions may be caught), the agent does not import the store at all, and the
contract the hook shares with the daemon imports nothing but itself and the standard library."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE_DIRS = ("src/trimtab/agent", "src/trimtab/api", "src/trimtab/cli", "src/trimtab/contract", "src/trimtab/control",
                "src/trimtab/grading", "src/trimtab/trainer", "src/trimtab/workload", "src/trimtab/deploy", "grafana",
                "src/trimtab/store")
MAY_IMPORT = {"sqlalchemy": {"Engine"}, "sqlalchemy.engine": {"Engine"}}  # and anything from sqlalchemy.exc


def imports(path: Path) -> list[tuple[str, set[str]]]:
    """(module, names) of every import in the file, also those inside functions."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(alias.name, set()) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.append((node.module, {alias.name for alias in node.names}))
    return out


def modules(*dirs: str):
    """Every module under the folders (a name without a slash is a package of src/trimtab); a folder that does not
    exist fails, so a scan cannot pass by reading nothing."""
    for d in dirs:
        folder = ROOT / (d if "/" in d or d == "grafana" else f"src/trimtab/{d}")
        assert folder.is_dir(), f"no folder {folder}"
        for path in sorted(folder.rglob("*.py")):
            yield path.relative_to(ROOT).as_posix(), imports(path)


def test_the_scan_sees_imports_inside_functions(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("def f():\n    from sqlalchemy import select\n    import trimtab.store.models\n")
    assert imports(probe) == [("sqlalchemy", {"select"}), ("trimtab.store.models", set())]


def test_nothing_outside_the_store_builds_sql_or_imports_its_tables():
    leaks = []
    for where, found in modules(*(d for d in PACKAGE_DIRS if d != "src/trimtab/store")):
        for module, names in found:
            tables = module == "trimtab.store.models" or (module == "trimtab.store" and "models" in names)
            sql = module.split(".")[0] == "sqlalchemy" and module != "sqlalchemy.exc" \
                and not (names and names <= MAY_IMPORT.get(module, set()))
            if tables or sql:
                leaks.append(f"{where}: from {module} import {', '.join(sorted(names)) or '*'}")
    assert not leaks, "\n".join(leaks)


def test_the_agent_does_not_import_the_store():
    back = [f"{where}: {module}" for where, found in modules("agent") for module, _ in found
            if module.startswith("trimtab.store")]
    assert not back, "\n".join(back)


def test_the_contract_imports_only_itself_and_the_standard_library():
    stdlib = set(sys.stdlib_module_names) | {"__future__"}
    foreign = [f"{where}: {module}" for where, found in modules("contract") for module, _ in found
               if not module.startswith("trimtab.contract") and module.split(".")[0] not in stdlib]
    assert not foreign, "\n".join(foreign)


def test_the_hook_imports_no_daemon_code():
    daemon = ("trimtab.agent", "trimtab.api", "trimtab.store", "trimtab.grading", "trimtab.control", "trimtab.cli",
              "trimtab.daemon")
    found = [f"{where}: {module}" for where, found in modules("trainer") for module, _ in found
             if module.startswith(daemon)]
    assert not found, "\n".join(found)
