"""``python -m trimtab.trainer.pipeline`` — see ``cli.py``."""

import sys

from .cli import main

sys.exit(main())
