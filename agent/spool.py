"""A bounded on-disk queue of batches that could not be written, replayed in order when the store returns.

Layout: ``<dir>/<seq:012d>.jsonl`` segment files, one batch per line, plus ``cursor`` (segment name and byte
offset of the first batch not yet written). Appends go to the newest segment; replay reads the oldest from the
cursor. A batch written and then replayed again (crash between write and cursor update) is harmless: the store's
unique keys make writes idempotent. When the spool would exceed ``max_bytes`` the oldest segment is dropped, and
the count of dropped batches and rows is returned so the caller can log it and record a health event: data is
never lost silently.
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional

from trimtab.agent.readings import Batch

log = logging.getLogger(__name__)

SEGMENT_SUFFIX = ".jsonl"


@dataclass(frozen=True)
class Dropped:
    """What an overflow threw away."""

    batches: int
    rows: int
    segment: str


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
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.max_bytes = max_bytes
        self.segment_bytes = segment_bytes
        self._lock = threading.Lock()
        self._cursor_path = self.directory / "cursor"
        self.corrupt_lines_skipped = 0
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
            name, offset = self._cursor_path.read_text().split()
            return name, int(offset)
        except (OSError, ValueError):
            return None, 0

    def _write_cursor(self, name: str, offset: int) -> None:
        tmp = self._cursor_path.with_suffix(".tmp")
        tmp.write_text(f"{name} {offset}\n")
        os.replace(tmp, self._cursor_path)

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
        """Append one batch; returns what had to be dropped to stay within ``max_bytes`` (usually nothing)."""
        line = (batch.to_json() + "\n").encode()
        with self._lock:
            segments = self._segments()
            if not segments or segments[-1].stat().st_size + len(line) > self.segment_bytes:
                seq = int(segments[-1].stem) + 1 if segments else 1
                target = self.directory / f"{seq:012d}{SEGMENT_SUFFIX}"
            else:
                target = segments[-1]
            with target.open("ab") as f:
                f.write(line)
                f.flush()
            return self._enforce_bound_locked(keep=target.name)

    def _enforce_bound_locked(self, keep: str) -> list[Dropped]:
        dropped: list[Dropped] = []
        while self._pending_bytes_locked() > self.max_bytes:
            segments = [s for s in self._segments() if s.name != keep]
            if not segments:
                break
            oldest = segments[0]
            cursor_name, cursor_offset = self._read_cursor()
            start = cursor_offset if oldest.name == cursor_name else 0
            batches = rows = 0
            for _, batch in self._iter_lines(oldest, start, report=False):
                if batch is not None:
                    batches += 1
                    rows += batch.row_count()
            oldest.unlink()
            if cursor_name == oldest.name:
                self._cursor_path.unlink(missing_ok=True)
            log.error("spool over %d bytes: dropped %d batches (%d rows) from %s", self.max_bytes, batches, rows, oldest.name)
            dropped.append(Dropped(batches=batches, rows=rows, segment=oldest.name))
        return dropped

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
                        self._cursor_path.unlink(missing_ok=True)
            return []

    def ack(self, item: SpooledBatch) -> None:
        """Mark everything up to and including ``item`` as written."""
        with self._lock:
            path = self.directory / item.segment
            if path.exists() and item.end_offset >= path.stat().st_size and path != self._segments()[-1]:
                path.unlink()
                self._cursor_path.unlink(missing_ok=True)
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

