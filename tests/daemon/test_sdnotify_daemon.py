"""`trimtab up` speaks systemd's notify protocol: READY, WATCHDOG pings from its loop, STOPPING on SIGTERM, in order,
and a SIGTERM flushes and exits 0."""

import signal
import socket
import time

import httpx

from tests.support.procs import drain, free_port, notify_listener, stop, trimtab, wait_http


def enough(messages: list[str]) -> bool:
    kinds = [m.split("=")[0] for m in messages]
    return kinds.count("WATCHDOG") >= 4 and "STATUS" in kinds


def test_up_sends_ready_watchdog_stopping_in_order(tmp_path):
    """Deterministic under load: it collects until 4 pings and a status line arrived (however long that takes, up
    to a minute), then sends SIGTERM at whatever point of the loop the daemon is; STOPPING must be the last word
    and no ping may follow it (the notifier guarantees that by construction, see trimtab.sdnotify)."""
    sock_path = tmp_path / "notify.sock"
    sock = notify_listener(sock_path)
    port = free_port()
    proc = trimtab("up", "--simulate", "2", "--port", str(port), "--interval", "0.1", "--status-every", "0.5",
                   env={"NOTIFY_SOCKET": str(sock_path), "WATCHDOG_USEC": "400000", "TRIMTAB_STATE_DIR": str(tmp_path)})
    messages: list[str] = []
    try:
        wait_http(f"http://127.0.0.1:{port}/healthz", proc=proc)
        health = httpx.get(f"http://127.0.0.1:{port}/healthz").json()
        assert health["simulated"] is True
        # Wait for what the test needs, not for a fixed time: a loaded machine is slower, never wrong.
        deadline = time.monotonic() + 60
        while not enough(messages) and time.monotonic() < deadline:
            try:
                messages.append(sock.recv(4096).decode())
            except socket.timeout:
                pass
        out, err = stop(proc, signal.SIGTERM)
        messages += drain(sock)
    finally:
        stop(proc)
        sock.close()
    assert proc.returncode == 0, err
    kinds = [m.split("\n")[0].split("=")[0] for m in messages]
    assert kinds[0] == "READY", messages
    assert kinds.count("WATCHDOG") >= 4, "pings at half the 0.4 s watchdog period"
    assert any(k == "STATUS" for k in kinds)
    assert kinds[-1] == "STOPPING" and "STOPPING" not in kinds[:-1], messages
    assert "SIMULATED" in err
