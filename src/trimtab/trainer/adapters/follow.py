"""Following a log file like ``tail -F``: complete lines only, across rotation and truncation.

A line is handed out only once its newline has been written (a reader polling in the middle of a write sees a
partial line; it is kept until the rest arrives). Rotation (the path now names another file) drains the old file
first; truncation (the file got shorter than what was read: ``copytruncate``, or verl restarting and opening
its log with mode "wb") starts again from the top. A partial line left in a rotated or truncated file can never be
completed and is dropped (counted).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import BinaryIO, Optional

log = logging.getLogger("trimtab.trainer")


class FileFollower:
    def __init__(self, path: os.PathLike | str, from_start: bool = True):
        self.path = Path(path)
        self._from_start = from_start
        self._fp: Optional[BinaryIO] = None
        self._identity: Optional[tuple[int, int]] = None
        self._partial = b""
        self.rotations = self.truncations = self.partial_lines_dropped = 0

    def poll(self) -> list[str]:
        """The complete lines written since the last call (never blocks)."""
        if self._fp is None and not self._open(at_end=not self._from_start):
            return []
        lines = self._read()
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return lines  # rotated away and not recreated yet: keep the old file open
        if (st.st_dev, st.st_ino) != self._identity:
            lines += self._read()  # the writer may have added a last line before the rename
            self._drop_partial("rotated")
            self._fp.close()
            self._fp = None
            self.rotations += 1
            if self._open(at_end=False):
                lines += self._read()
        elif st.st_size < self._fp.tell():
            self._drop_partial("truncated")
            self._fp.seek(0)
            self.truncations += 1
            lines += self._read()
        return lines

    def close(self) -> None:
        if self._fp is not None:
            self._fp.close()
            self._fp = None

    def _open(self, at_end: bool) -> bool:
        try:
            self._fp = open(self.path, "rb")
        except FileNotFoundError:
            return False
        st = os.fstat(self._fp.fileno())
        self._identity = (st.st_dev, st.st_ino)
        if at_end:
            self._fp.seek(0, os.SEEK_END)
        return True

    def _read(self) -> list[str]:
        data = self._fp.read()
        if not data:
            return []
        *complete, self._partial = (self._partial + data).split(b"\n")
        return [line.decode("utf-8", "replace") for line in complete if line.strip()]

    def _drop_partial(self, why: str) -> None:
        if self._partial:
            self.partial_lines_dropped += 1
            log.warning("trimtab: %s: dropped an unfinished last line of %d bytes (file %s)",
                        self.path, len(self._partial), why)
            self._partial = b""
