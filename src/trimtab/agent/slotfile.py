"""A one-line state file rewritten in place, so updating it needs no free disk space.

The spool's cursor and its count of unreported drops change after every replayed batch. Writing them to a
temporary file and renaming it needs a new block each time, which a full disk refuses, and the spool then never
drains. A slot is a fixed-size file allocated once and overwritten with ``pwrite``; if even that fails (it could
never be created, a read-only disk), the value is kept in memory and written back on the next successful
write, so the process keeps making progress and loses only what a crash would lose anyway.
A torn slot reads as empty: the spool then replays from the start of its oldest segment, which is harmless
because the store's writes are idempotent.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Optional

log = logging.getLogger(__name__)

SLOT_BYTES = 128


class SlotFile:
    def __init__(self, path: Path):
        self.path = Path(path)
        self._unsaved: Optional[str] = None  # newer than the file: a write that could not reach the disk

    def read(self) -> Optional[str]:
        """The stored text, or None when empty, missing or unreadable."""
        if self._unsaved is not None:
            text = self._unsaved
        else:
            try:
                text = self.path.read_bytes().decode("ascii", "replace")
            except OSError:
                return None
        text = text.strip()
        return text or None

    def write(self, text: str) -> bool:
        """Store ``text`` (one short line; "" empties the slot). False: kept in memory only, for now."""
        data = text.encode("ascii")
        if len(data) >= SLOT_BYTES:
            raise ValueError(f"slot text longer than {SLOT_BYTES - 1} bytes: {text!r}")
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
            try:
                os.pwrite(fd, data.ljust(SLOT_BYTES - 1) + b"\n", 0)  # same size every time: no new blocks
            finally:
                os.close(fd)
        except OSError as exc:
            if self._unsaved is None:
                log.error("cannot write %s (%s): keeping it in memory until the disk takes it", self.path, exc)
            self._unsaved = text
            return False
        if self._unsaved is not None:
            log.warning("%s written again", self.path)
        self._unsaved = None
        return True
