"""A training environment needs torch and httpx only: ``trimtab.trainer`` and its adapters import, attach and
report with the server's web stack and database drivers made unimportable; the contract they share with the
daemon needs not even those."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

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
                         timeout=60, cwd=Path(__file__).resolve().parents[2])
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
                         text=True, timeout=60, cwd=Path(__file__).resolve().parents[2])
    assert out.returncode == 0, out.stderr
    loaded = json.loads(out.stdout.strip().splitlines()[-1])
    assert [m for m in loaded if m != "trimtab" and not m.startswith("trimtab.contract")] == []
