"""Step reports that wait on disk while no server answers (a head outage): an append-only queue of JSON lines in
segment files under one directory per reporter, bounded in bytes, read back in order.

Only the reporter thread touches it (the training thread never waits on a disk). A line is ``<flags>\\t<report>``:
the flags say what the reporter knows of the report (sent once already, perhaps stored), so its counters stay
exact when a report comes back from disk. Segments of ``segment_bytes`` are deleted as soon as they are read and
confirmed, so the disk holds what is still to send (give or take one segment), never more than ``max_bytes``: an
append that would pass it writes what fits and says how many that was.

One process's spool: the directory's name holds the host and pid, it is removed when the reporter closes, and a
directory a dead process of this host left behind is removed when a new spool starts beside it. A job that dies
during an outage loses what its spool held (the next run does not resend the last run's steps).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
from collections import deque
from dataclasses import dataclass
from pathlib import Path

from trimtab.paths import private_dir

SEGMENT_BYTES = 1024 * 1024
DOUBT = 2  # a flag bit: the report was in a POST that got no answer (the server may have stored it)

Item = list  # [report (dict), flags (int)]: mutable, the reporter marks its flags after a failed POST


@dataclass
class _Segment:
    path: Path
    written_bytes: int = 0


class ReportSpool:
    """``append`` reports at the end, ``peek`` the oldest, ``commit`` them once the server confirmed them. Every
    method may raise ``OSError`` (a full disk, a directory removed, a torn line): the caller treats the spool as
    broken and keeps what it can in memory."""

    def __init__(self, directory: Path, max_bytes: int, segment_bytes: int = SEGMENT_BYTES):
        if max_bytes <= 0:
            raise ValueError(f"max_bytes must be > 0, not {max_bytes!r}")
        self.directory = Path(directory)
        self.max_bytes = int(max_bytes)
        self._segment_bytes = max(1, min(int(segment_bytes), self.max_bytes // 4 or 1))
        self._segments: deque[_Segment] = deque()
        self._seq = 0
        self._head: list[Item] = []  # peeked from the first segment, not committed yet
        self._head_ends: list[int] = []  # each peeked line's end offset in the first segment
        self._read_offset = 0  # where the first uncommitted line starts, in the first segment
        self.records = 0  # on disk and not committed (peeked ones included)
        self.doubtful = 0  # of those, flagged DOUBT
        self.bytes = 0  # the live segments' size
        self.bytes_peak = 0
        private_dir(self.directory)
        remove_stale_siblings(self.directory)

    @property
    def room_bytes(self) -> int:
        return self.max_bytes - self.bytes

    def append(self, items: list[Item]) -> int:
        """Writes the oldest of ``items`` that fit under ``max_bytes``, in order; how many."""
        lines = [f"{int(flags)}\t{json.dumps(report, separators=(',', ':'))}\n".encode() for report, flags in items]
        fit, size = 0, 0
        for line in lines:
            if self.bytes + size + len(line) > self.max_bytes:
                break
            fit, size = fit + 1, size + len(line)
        start = 0
        while start < fit:
            tail = self._segments[-1] if self._segments else None
            if tail is None or tail.written_bytes >= self._segment_bytes:
                self._seq += 1
                tail = _Segment(self.directory / f"{self._seq:09d}.jsonl")
                self._segments.append(tail)
            end, room = start, self._segment_bytes - tail.written_bytes
            while end < fit and (end == start or len(lines[end]) <= room):
                room -= len(lines[end])
                end += 1
            blob = b"".join(lines[start:end])
            _write_at(tail.path, tail.written_bytes, blob)
            tail.written_bytes += len(blob)
            self.bytes += len(blob)
            self.records += end - start
            self.doubtful += sum(1 for _, flags in items[start:end] if flags & DOUBT)
            start = end
        self.bytes_peak = max(self.bytes_peak, self.bytes)
        return fit

    def peek(self, n: int) -> list[Item]:
        """The oldest ``n`` reports not committed (fewer at a segment's end), as items the caller may re-flag."""
        if len(self._head) < n and self._segments:
            self._read_more(n - len(self._head))
        return self._head[:n]

    def flag(self, n: int, bits: int) -> None:
        """Sets ``bits`` on the first ``n`` peeked reports (a POST of them failed)."""
        for item in self._head[:n]:
            if bits & DOUBT and not item[1] & DOUBT:
                self.doubtful += 1
            item[1] |= bits

    def commit(self, n: int) -> None:
        """The first ``n`` peeked reports are done with (confirmed or refused): forget them, free their segment."""
        done, self._head = self._head[:n], self._head[n:]
        self._read_offset = self._head_ends[n - 1] if n else self._read_offset
        self._head_ends = self._head_ends[n:]
        self.records -= len(done)
        self.doubtful -= sum(1 for item in done if item[1] & DOUBT)
        first = self._segments[0] if self._segments else None
        if first is not None and not self._head and self._read_offset >= first.written_bytes:
            self._segments.popleft()
            self.bytes -= first.written_bytes
            self._read_offset = 0
            first.path.unlink()

    def remove(self) -> None:
        """Deletes the directory and everything in it (the reporter closed)."""
        self._segments.clear()
        self._head, self._head_ends = [], []
        self.records = self.doubtful = self.bytes = 0
        shutil.rmtree(self.directory, ignore_errors=True)

    def _read_more(self, n: int) -> None:
        first = self._segments[0]
        pos = self._head_ends[-1] if self._head_ends else self._read_offset
        with first.path.open("rb") as f:
            f.seek(pos)
            while n > 0 and pos < first.written_bytes:
                line = f.readline()
                pos += len(line)
                flags, tab, body = line.partition(b"\t")
                try:
                    if not tab or not line.endswith(b"\n") or pos > first.written_bytes:
                        raise ValueError("a torn line")
                    self._head.append([json.loads(body), int(flags)])
                except ValueError as exc:
                    raise OSError(f"unreadable line at byte {pos - len(line)} of {first.path}: {exc}") from exc
                self._head_ends.append(pos)
                n -= 1


def _write_at(path: Path, offset: int, blob: bytes) -> None:
    """Writes ``blob`` at ``offset`` of ``path`` (its end as the spool knows it), all or nothing: after a short
    write or an error (ENOSPC) the file is cut back to ``offset``, so no torn line is left for the reader."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    done = 0
    try:
        while done < len(blob):
            done += os.pwrite(fd, blob[done:], offset + done)
    except OSError:
        os.ftruncate(fd, offset)
        raise
    finally:
        os.close(fd)


def spool_dir_name(name: str, serial: int) -> str:
    """``<name>.<host>.<pid>.<serial>``: one reporter's directory, unique on a shared file system."""
    return f"{name}.{socket.gethostname()}.{os.getpid()}.{serial}"


def remove_stale_siblings(directory: Path) -> None:
    """Removes the spools of dead processes of this host beside ``directory`` (a job killed during an outage)."""
    host = socket.gethostname()
    for sibling in directory.parent.iterdir():
        parts = sibling.name.rsplit(".", 2)  # [<name>.<host>, pid, serial]: names and hosts may hold dots
        if sibling == directory or len(parts) != 3 or not parts[0].endswith(f".{host}") or not parts[1].isdigit():
            continue
        if not _alive(int(parts[1])):
            shutil.rmtree(sibling, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # someone else's process: alive
    return True
