"""Where trimtab keeps its state: the SQLite file, the spool, tokens.

Under systemd the unit's ``StateDirectory=`` sets ``$STATE_DIRECTORY`` (``/var/lib/trimtab``); otherwise the
user's data dir (``$XDG_DATA_HOME/trimtab``, default ``~/.local/share/trimtab``). ``TRIMTAB_STATE_DIR`` wins
over both, so tests and containers can point it anywhere.
"""

from __future__ import annotations

import os
from pathlib import Path


def state_dir() -> Path:
    explicit = os.environ.get("TRIMTAB_STATE_DIR")
    if explicit:
        return Path(explicit)
    systemd = os.environ.get("STATE_DIRECTORY")
    if systemd:
        # systemd may pass several colon-separated directories; the first is ours.
        return Path(systemd.split(":")[0])
    xdg = os.environ.get("XDG_DATA_HOME")
    base = Path(xdg) if xdg else Path.home() / ".local" / "share"
    return base / "trimtab"


def default_db_url() -> str:
    return f"sqlite:///{state_dir() / 'trimtab.db'}"


def default_spool_dir() -> Path:
    return state_dir() / "spool"
