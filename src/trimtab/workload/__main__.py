"""``python -m trimtab.workload`` — see ``cli.py``. Without torch (or numpy) it says what to install in one
line, as `trimtab demo` does, instead of a traceback."""

import sys

try:
    from .cli import main
except ModuleNotFoundError as exc:
    if exc.name not in ("torch", "numpy"):
        raise
    sys.exit(f"python -m trimtab.workload needs the trainer extra (torch and numpy): pip install "
             f"'.[trainer]' in trimtab's checkout; without a GPU install the CPU build of torch first, pip install "
             f"torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu ({exc})")

sys.exit(main())
