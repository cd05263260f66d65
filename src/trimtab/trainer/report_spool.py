"""Step reports that wait on disk while no server answers (a head outage): an append-only queue of JSON lines in
segment files under one directory per reporter, bounded in bytes, read back in order.

Only the reporter thread touches it (the training thread never waits on a disk). A line is ``<flags>\\t<report>``:
the flags say what the reporter knows of the report (sent once already, perhaps stored), so its counters stay
exact when a report comes back from disk. Segments of ``segment_bytes`` are deleted as soon as they are read and
confirmed, so the disk holds what is still to send (give or take one segment), never more than ``max_bytes``: an
append that would pass it writes what fits and says how many that was.

One job rank's spool on a host: the directory ``<job>.rank<r>.<host>`` (:func:`stable_dir_name`), held under an
exclusive ``flock`` on its ``lock`` file while a process uses it. A process that stops while reports wait — killed,
or closed with the server still away (:meth:`ReportSpool.leave`) — leaves the directory, and the next process of the
same job and rank on the host picks it up: it sends those reports first, in order, from where the last one's
confirmed reports end (the ``cursor`` file; a report sent again anyway is not stored twice: the server keeps one
report per job, step and rank). While another live process holds that directory (two runs of one job and rank at
once) a process spools under ``<job>.rank<r>.<host>.<pid>.<serial>`` instead, removed when it closes, and by the
next spool started beside it once its process is dead. A job never run again leaves its last spool (at most
``max_bytes``) until removed by hand.
"""

from __future__ import annotations

import fcntl
import itertools
import json
import logging
import os
import shutil
import socket
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from trimtab.paths import private_dir

SEGMENT_BYTES = 1024 * 1024
DOUBT = 2  # a flag bit: the report was in a POST that got no answer (the server may have stored it)

Item = list  # [report (dict), flags (int)]: mutable, the reporter marks its flags after a failed POST
LOCK_FILE, CURSOR_FILE, SEGMENT_SUFFIX = "lock", "cursor", ".jsonl"
_serials = itertools.count(1)
log = logging.getLogger("trimtab.trainer")


class SpoolTaken(Exception):
    """Another live process holds the spool directory."""


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
        self.adopted = 0  # reports a previous process left here, picked up at start
        private_dir(self.directory)
        self._lock_fd: Optional[int] = _lock(self.directory)
        try:
            self._adopt()
        except BaseException:
            self._unlock()
            raise
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
                tail = _Segment(self.directory / f"{self._seq:09d}{SEGMENT_SUFFIX}")
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
        elif first is not None and n:  # where the next process starts, should this one stop now
            _write_at(self.directory / CURSOR_FILE, 0, _cursor_line(first.path.name, self._read_offset))

    def remove(self) -> None:
        """Deletes the directory and everything in it (nothing waits, or a disk error), and lets go of it."""
        self._segments.clear()
        self._head, self._head_ends = [], []
        self.records = self.doubtful = self.bytes = 0
        shutil.rmtree(self.directory, ignore_errors=True)
        self._unlock()

    def leave(self) -> None:
        """Lets go of the directory and what waits in it, for the next process of this job and rank to send."""
        self._unlock()

    def _unlock(self) -> None:
        if self._lock_fd is not None:
            fd, self._lock_fd = self._lock_fd, None
            os.close(fd)  # the flock goes with it

    def _adopt(self) -> None:
        """Picks up the segments a process before this one left in the directory, in order, from its cursor; a
        torn or unreadable line (a process killed mid-write) ends what is picked up, cut off and said."""
        paths = sorted((p for p in self.directory.glob(f"*{SEGMENT_SUFFIX}") if p.stem.isdigit()),
                       key=lambda p: int(p.stem))
        if not paths:
            return
        self._seq = int(paths[-1].stem)
        cursor = _read_cursor(self.directory / CURSOR_FILE)
        for at, path in enumerate(paths):
            data = path.read_bytes()
            start = cursor[1] if cursor is not None and cursor[0] == path.name and not self._segments else 0
            end, records, doubtful = _scan(data, min(start, len(data)))
            torn = end < len(data)
            if records:
                if not self._segments:
                    self._read_offset = start
                self._segments.append(_Segment(path, end))
                self.records, self.doubtful, self.bytes = self.records + records, self.doubtful + doubtful, \
                    self.bytes + end
                if torn:
                    os.truncate(path, end)
            else:  # read and confirmed to its end, or nothing readable in it
                path.unlink()
            if torn:
                log.warning("trimtab: the report spool %s left by an earlier process holds an unreadable line at "
                            "byte %d of %s: it and the %d segments after it are dropped", self.directory, end,
                            path.name, len(paths) - at - 1)
                for rest in paths[at + 1:]:
                    rest.unlink()
                break
        self.adopted = self.records
        self.bytes_peak = self.bytes

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
    """``<name>.<host>.<pid>.<serial>``: one reporter's own directory, unique on a shared file system."""
    return f"{name}.{socket.gethostname()}.{os.getpid()}.{serial}"


def stable_dir_name(name: str) -> str:
    """``<name>.<host>`` (``name``: the job and rank): the directory each process of them on this host uses in
    turn, so a process started again picks up what the last one left."""
    return f"{name}.{socket.gethostname()}"


def open_spool(parent: Path, name: str, max_bytes: int) -> ReportSpool:
    """The spool of ``name`` under ``parent``: the one a previous process left (picked up) or a new one, in the
    stable directory; while another live process holds that, one of this process's own."""
    try:
        return ReportSpool(Path(parent) / stable_dir_name(name), max_bytes)
    except SpoolTaken:
        return ReportSpool(Path(parent) / spool_dir_name(name, next(_serials)), max_bytes)


def _lock(directory: Path) -> int:
    """An exclusive flock on the directory's lock file (released when the fd closes, or the process dies)."""
    fd = os.open(directory / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise SpoolTaken(f"{directory} is in use by another process") from None
    except OSError:
        os.close(fd)
        raise
    return fd


def _cursor_line(segment: str, offset: int) -> bytes:
    """One fixed-width line (rewritten in place): the first segment's name and where its unconfirmed lines start."""
    return f"{segment:>24} {offset:020d}\n".encode()


def _read_cursor(path: Path) -> Optional[tuple[str, int]]:
    try:
        name, offset = path.read_text().split()
        return name, int(offset)
    except (OSError, ValueError):
        return None


def _scan(data: bytes, start: int) -> tuple[int, int, int]:
    """(where the readable lines from ``start`` end, how many, how many flagged DOUBT)."""
    pos = end = start
    records = doubtful = 0
    while pos < len(data):
        newline = data.find(b"\n", pos)
        if newline < 0:
            break
        flags, tab, body = data[pos:newline].partition(b"\t")
        try:
            if not tab:
                raise ValueError("no tab")
            json.loads(body)
            bits = int(flags)
        except ValueError:
            break
        records += 1
        doubtful += 1 if bits & DOUBT else 0
        pos = end = newline + 1
    return end, records, doubtful


def remove_stale_siblings(directory: Path) -> None:
    """Removes the own spools (``<name>.<host>.<pid>.<serial>``) of dead processes of this host beside
    ``directory``; the stable ones wait for their job and rank."""
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
