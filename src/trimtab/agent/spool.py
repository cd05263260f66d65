"""A bounded on-disk queue of batches that could not be written, replayed in order when the store returns.

Layout: ``<dir>/<seq:012d>.jsonl`` segment files, one batch per line, plus ``cursor`` (segment name and byte
offset of the first batch not yet written). Appends go to the newest segment; replay reads the oldest from the
cursor. A batch written and then replayed again (crash between write and cursor update) is harmless: the store's
unique keys make writes idempotent. When the spool would exceed ``max_bytes`` the oldest segment is dropped, and
the count of dropped batches and rows is returned so the caller can log it and record a health event: data is
never lost silently.

A full disk is the same overflow, met earlier: an append that gets ENOSPC is cut back to a whole line, the oldest
segments make room, and when none is left the batch itself is returned as dropped. The cursor and the count of
drops not yet reported to the store (``dropped``) are :class:`SlotFile` s, rewritten in place, so replay and its
acknowledgements keep working on a disk with no free byte, and each replayed segment frees its space.
"""

from __future__ import annotations

import errno
import logging
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional

from trimtab.contract.readings import Batch
from trimtab.agent.slotfile import SlotFile
from trimtab.paths import private_dir

log = logging.getLogger(__name__)

SEGMENT_SUFFIX = ".jsonl"


@dataclass(frozen=True)
class Dropped:
    """What an overflow threw away."""

    batches: int
    rows: int
    segment: str  # the segment dropped, or "-" for a batch that could not be written at all
    reason: str = "over the spool's bound"


@dataclass(frozen=True)
class SpooledBatch:
    """A batch read back from the spool, with where it ends (for :meth:`Spool.ack`)."""

    batch: Batch
    segment: str
    end_offset: int


class Spool:
    def __init__(self, directory: Path, max_bytes: int = 256 * 1024 * 1024, segment_bytes: int = 4 * 1024 * 1024):
        if max_bytes < segment_bytes:
            segment_bytes = max(1024, max_bytes // 4)
        self.directory = private_dir(Path(directory))  # 0700: batches name hosts, GPUs and processes
        self.max_bytes = max_bytes
        self.segment_bytes = segment_bytes
        self._lock = threading.Lock()
        self._cursor = SlotFile(self.directory / "cursor")
        self._drops = SlotFile(self.directory / "dropped")
        for slot in (self._cursor, self._drops):
            slot.write(slot.read() or "")  # allocate both now, while there may be space
        self.corrupt_lines_skipped = 0
        self._unwritable, self._unwritable_logged = 0, -1e9
        self._repair_torn_tail()

    def _repair_torn_tail(self) -> None:
        """A crash mid-append can leave a partial last line; cut it so the next append starts a clean line."""
        segments = self._segments()
        if not segments:
            return
        last = segments[-1]
        data = last.read_bytes()
        if data and not data.endswith(b"\n"):
            keep = data.rfind(b"\n") + 1
            with last.open("r+b") as f:
                f.truncate(keep)
            self.corrupt_lines_skipped += 1
            log.error("spool %s: cut a torn final line of %d bytes left by a crash", last.name, len(data) - keep)

    # -- state ---------------------------------------------------------------------------------------------------
    def _segments(self) -> list[Path]:
        return sorted(p for p in self.directory.iterdir() if p.suffix == SEGMENT_SUFFIX)

    def _read_cursor(self) -> tuple[Optional[str], int]:
        try:
            name, offset = (self._cursor.read() or "").split()
            return name, int(offset)
        except ValueError:
            return None, 0

    def _write_cursor(self, name: str, offset: int) -> None:
        self._cursor.write(f"{name} {offset}")

    def _clear_cursor(self) -> None:
        self._cursor.write("")

    def pending_bytes(self) -> int:
        with self._lock:
            return self._pending_bytes_locked()

    def _pending_bytes_locked(self) -> int:
        cursor_name, cursor_offset = self._read_cursor()
        total = 0
        for seg in self._segments():
            size = seg.stat().st_size
            total += size - cursor_offset if seg.name == cursor_name else size
        return max(total, 0)

    def is_empty(self) -> bool:
        return self.pending_bytes() == 0

    # -- writing -------------------------------------------------------------------------------------------------
    def append(self, batch: Batch) -> list[Dropped]:
        """Append one batch; returns what had to be dropped to stay within ``max_bytes`` or to fit on the disk
        (usually nothing). When the batch itself could not be written, the last entry has ``segment == "-"``."""
        line = (batch.to_json() + "\n").encode()
        dropped: list[Dropped] = []
        with self._lock:
            while True:
                segments = self._segments()
                if not segments or segments[-1].stat().st_size + len(line) > self.segment_bytes:
                    seq = int(segments[-1].stem) + 1 if segments else 1
                    target = self.directory / f"{seq:012d}{SEGMENT_SUFFIX}"
                else:
                    target = segments[-1]
                try:
                    _append_whole_line(target, line)
                    break
                except OSError as exc:
                    reason = f"cannot write the spool: {exc.strerror or exc}"
                    older = [s for s in segments if s.name != target.name]
                    if exc.errno in (errno.ENOSPC, errno.EDQUOT) and older:
                        dropped.append(self._drop_segment_locked(older[0], reason="disk full"))
                        continue
                    self._log_unwritable(reason, batch.row_count())
                    dropped.append(Dropped(batches=1, rows=batch.row_count(), segment="-", reason=reason))
                    return dropped
            return dropped + self._enforce_bound_locked(keep=target.name)

    def _log_unwritable(self, reason: str, rows: int) -> None:
        """At most one line a minute while the disk stays full: a day of ENOSPC must not fill the log instead."""
        self._unwritable += 1
        now = time.monotonic()
        if now - self._unwritable_logged >= 60.0:
            log.error("spool %s: %s; dropped this batch of %d rows (%d batches not written since the last message)",
                      self.directory, reason, rows, self._unwritable)
            self._unwritable_logged, self._unwritable = now, 0

    def _enforce_bound_locked(self, keep: str) -> list[Dropped]:
        dropped: list[Dropped] = []
        while self._pending_bytes_locked() > self.max_bytes:
            segments = [s for s in self._segments() if s.name != keep]
            if not segments:
                break
            dropped.append(self._drop_segment_locked(segments[0], reason=f"spool over {self.max_bytes} bytes"))
        return dropped

    def _drop_segment_locked(self, segment: Path, reason: str) -> Dropped:
        """Delete a segment, counting the batches and rows not yet replayed from it."""
        cursor_name, cursor_offset = self._read_cursor()
        start = cursor_offset if segment.name == cursor_name else 0
        batches = rows = 0
        for _, batch in self._iter_lines(segment, start, report=False):
            if batch is not None:
                batches += 1
                rows += batch.row_count()
        segment.unlink()
        if cursor_name == segment.name:
            self._clear_cursor()
        log.error("spool: %s: dropped %d batches (%d rows) from %s", reason, batches, rows, segment.name)
        return Dropped(batches=batches, rows=rows, segment=segment.name, reason=reason)

    # -- replay --------------------------------------------------------------------------------------------------
    def _iter_lines(self, segment: Path, start: int, report: bool = True) -> Iterator[tuple[int, Optional[Batch]]]:
        with segment.open("rb") as f:
            f.seek(start)
            offset = start
            for raw in f:
                offset += len(raw)
                try:
                    if not raw.endswith(b"\n"):
                        raise ValueError("torn line (no newline)")
                    batch = Batch.from_json(raw.decode())
                except (ValueError, KeyError, TypeError) as exc:
                    if report:
                        self.corrupt_lines_skipped += 1
                        log.error("spool %s: skipping an unreadable batch at byte %d: %s", segment.name, offset - len(raw), exc)
                    batch = None
                yield offset, batch

    def peek(self, limit: int = 64) -> list[SpooledBatch]:
        """The oldest pending batches, in order (at most ``limit``, all from one segment)."""
        with self._lock:
            cursor_name, cursor_offset = self._read_cursor()
            for seg in self._segments():
                if cursor_name is not None and seg.name < cursor_name:
                    seg.unlink()  # fully replayed earlier; the unlink was interrupted
                    continue
                start = cursor_offset if seg.name == cursor_name else 0
                out: list[SpooledBatch] = []
                last_offset = start
                for end, batch in self._iter_lines(seg, start):
                    last_offset = end
                    if batch is not None:
                        out.append(SpooledBatch(batch, seg.name, end))
                        if len(out) >= limit:
                            break
                if out:
                    return out
                # Nothing readable left in this segment: move past it.
                if seg != self._segments()[-1] or last_offset >= seg.stat().st_size:
                    seg.unlink()
                    if cursor_name == seg.name:
                        self._clear_cursor()
            return []

    def ack(self, item: SpooledBatch) -> None:
        """Mark everything up to and including ``item`` as written."""
        with self._lock:
            path = self.directory / item.segment
            if path.exists() and item.end_offset >= path.stat().st_size and path != self._segments()[-1]:
                path.unlink()
                self._clear_cursor()
            else:
                self._write_cursor(item.segment, item.end_offset)

    def stats(self) -> dict[str, int]:
        with self._lock:
            cursor_name, cursor_offset = self._read_cursor()
            batches = 0
            for seg in self._segments():
                start = cursor_offset if seg.name == cursor_name else 0
                batches += sum(1 for _, b in self._iter_lines(seg, start, report=False) if b is not None)
            return {"batches": batches, "bytes": self._pending_bytes_locked()}


    # -- drops not yet reported ------------------------------------------------------------------------------------
    def record_drops(self, batches: int, rows: int) -> None:
        """Add to the count of dropped batches and rows that no health event in the store accounts for yet."""
        with self._lock:
            old_batches, old_rows = self._unreported_locked()
            self._drops.write(f"{old_batches + batches} {old_rows + rows}")

    def unreported_drops(self) -> tuple[int, int]:
        """(batches, rows) dropped and not yet reported; kept across restarts."""
        with self._lock:
            return self._unreported_locked()

    def drops_reported(self, batches: int, rows: int) -> None:
        """A health event for this many drops is in the store: take them off the count (newer drops stay)."""
        with self._lock:
            old_batches, old_rows = self._unreported_locked()
            self._drops.write(f"{max(old_batches - batches, 0)} {max(old_rows - rows, 0)}")

    def _unreported_locked(self) -> tuple[int, int]:
        try:
            batches, rows = (self._drops.read() or "0 0").split()
            return int(batches), int(rows)
        except ValueError:
            return 0, 0


def _append_whole_line(path: Path, line: bytes) -> None:
    """Append ``line`` or nothing: a short write or an error (ENOSPC) cuts the file back to where it was, so a
    full disk never leaves a torn line that would swallow the next batch."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        start = os.fstat(fd).st_size
        try:
            view = memoryview(line)
            while view:
                view = view[os.write(fd, view):]
        except OSError:
            os.ftruncate(fd, start)
            raise
    finally:
        os.close(fd)
