"""A real, small filesystem for disk-full tests: a tmpfs of a given size, mounted for one test and unmounted after.

A real ENOSPC (from the kernel, at whatever byte the filesystem runs out) is what the spool and SQLite meet in the
field; a fault-injecting wrapper would only raise where we thought to put it. Mounting needs root (or
CAP_SYS_ADMIN); without it the test skips and says so.
"""

from __future__ import annotations

import errno
import os
import subprocess
from pathlib import Path

import pytest


@pytest.fixture
def small_disk(tmp_path):
    """``mount(size_bytes) -> Path``: a fresh tmpfs of ``size_bytes`` under the test's tmp dir."""
    mounted: list[Path] = []

    def mount(size_bytes: int) -> Path:
        point = tmp_path / f"disk{len(mounted)}"
        point.mkdir()
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_bytes},mode=0700", "tmpfs", str(point)],
                              capture_output=True, text=True)
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs for a disk-full test (needs root): {done.stderr.strip()}")
        mounted.append(point)
        return point

    yield mount
    for point in mounted:
        subprocess.run(["umount", "-l", str(point)], check=False)


def fill(disk: Path, name: str = "filler", leave_bytes: int = 0) -> Path:
    """Fill ``disk`` with one file until at most ``leave_bytes`` remain free (a real ENOSPC stops it)."""
    path = disk / name
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        while (free := free_bytes(disk) - leave_bytes) > 0:
            try:
                os.write(fd, b"\0" * min(free, 1 << 20))
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                break
    finally:
        os.close(fd)
    return path


def free_bytes(disk: Path) -> int:
    st = os.statvfs(disk)
    return st.f_bavail * st.f_frsize
