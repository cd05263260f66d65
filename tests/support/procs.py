"""Starting and stopping real `trimtab` processes in tests, on loopback ports, always cleaned up."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(module: str, tmp_path, *args: str, world: int = 2, timeout_s: float = 60.0) -> list[dict]:
    """``python -m MODULE rank world port out.json ARGS…`` for every rank at once (their rendezvous on a free
    loopback port); each must exit 0; their JSON outputs, rank order. A rank still running at the deadline is
    killed with the others — one stuck rank must not leave the rest behind."""
    import json
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    port = free_port()
    outs = [tmp_path / f"rank{r}.json" for r in range(world)]
    procs = [subprocess.Popen([sys.executable, "-m", module, str(r), str(world), str(port), str(outs[r]), *args],
                              cwd=repo, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(world)]
    deadline = time.monotonic() + timeout_s
    logs = []
    try:
        for proc in procs:
            logs.append(proc.communicate(timeout=max(0.1, deadline - time.monotonic()))[0])
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    for proc, log in zip(procs, logs):
        assert proc.returncode == 0, log
    print("\n".join(logs))  # shown by pytest when a test fails
    return [json.loads(o.read_text()) for o in outs]


def trimtab(*args: str, env: dict | None = None, **kw) -> subprocess.Popen:
    """`trimtab ARGS` as a child process (stderr captured to a file-like pipe unless given)."""
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    kw.setdefault("stdout", subprocess.PIPE)
    kw.setdefault("stderr", subprocess.PIPE)
    return subprocess.Popen([sys.executable, "-m", "trimtab.cli.main", *args], env=full_env, text=True, **kw)


def wait_http(url: str, timeout_s: float = 30.0, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode}: {proc.stderr.read() if proc.stderr else ''}")
        try:
            if httpx.get(url, timeout=1.0).status_code < 600:
                return
        except httpx.HTTPError:
            time.sleep(0.1)
    raise TimeoutError(f"{url} did not answer within {timeout_s} s")


def stop(proc: subprocess.Popen, sig: int = signal.SIGTERM, timeout_s: float = 20.0) -> tuple[str, str]:
    if proc.poll() is None:
        proc.send_signal(sig)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
    return out or "", err or ""


def notify_listener(path, timeout_s: float = 0.2) -> socket.socket:
    """A datagram socket at ``path`` for a child's NOTIFY_SOCKET (systemd's notify protocol)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.settimeout(timeout_s)
    return sock


def drain(sock: socket.socket) -> list[str]:
    """The notifications waiting on ``sock``, until it stays quiet for its timeout."""
    messages = []
    while True:
        try:
            messages.append(sock.recv(4096).decode())
        except socket.timeout:
            return messages


def admin_secret(state_dir) -> str:
    """The secret of the one admin token file a daemon wrote into ``state_dir`` (admin.token for the state dir's
    own store, admin-<database>-<hash>.token for another)."""
    from pathlib import Path

    (path,) = Path(state_dir).glob("admin*.token")
    return path.read_text().strip()
