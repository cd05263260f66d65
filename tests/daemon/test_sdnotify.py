"""The Notifier speaks sd_notify to a real AF_UNIX datagram socket, as systemd's NOTIFY_SOCKET: READY, then
WATCHDOG pings at half the watchdog period, STATUS lines, STOPPING, in order; the abstract-namespace form works;
and without NOTIFY_SOCKET every call is a harmless no-op."""

from __future__ import annotations

import os
import shutil
import socket
import struct
import tempfile
import threading
import time
from pathlib import Path

import pytest

from trimtab.sdnotify import Notifier


class Receiver:
    """The systemd side: a bound datagram socket that also reports each sender's pid (SO_PASSCRED), which is
    what NotifyAccess=main checks."""

    def __init__(self, address: str):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        self.sock.bind(address)
        self.sock.settimeout(2)

    def messages(self, wait_s: float = 0.2) -> list[tuple[str, int]]:
        """(message, sender pid) of every datagram that arrived, oldest first."""
        out = []
        self.sock.settimeout(wait_s)
        creds_size = struct.calcsize("3i")
        while True:
            try:
                data, ancdata, _, _ = self.sock.recvmsg(4096, socket.CMSG_SPACE(creds_size))
            except TimeoutError:
                return out
            pid = next(struct.unpack("3i", d[:creds_size])[0] for level, kind, d in ancdata
                       if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS)
            out.append((data.decode(), pid))

    def close(self):
        self.sock.close()


@pytest.fixture
def short_dir():
    # AF_UNIX paths are limited to 108 bytes: pytest's tmp_path can be longer.
    path = Path(tempfile.mkdtemp(prefix="sdn", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def notify_socket(short_dir, monkeypatch):
    address = str(short_dir / "notify.sock")
    receiver = Receiver(address)
    monkeypatch.setenv("NOTIFY_SOCKET", address)
    monkeypatch.setenv("WATCHDOG_USEC", "200000")  # 0.2 s: pings due every 0.1 s
    yield receiver
    receiver.close()


def drive_like_a_daemon(n: Notifier, loop_s: float = 0.35, tick_s: float = 0.01) -> None:
    """What the daemon does: READY when up, a watchdog call every tick of its main loop, a STATUS line now and
    then, STOPPING on SIGTERM."""
    assert n.ready("started: 4 GPUs")
    end = time.monotonic() + loop_s
    while time.monotonic() < end:
        n.watchdog()
        time.sleep(tick_s)
    assert n.status("ticks=35 store=ok")
    assert n.stopping()


def test_ready_watchdog_status_stopping_arrive_in_order(notify_socket):
    n = Notifier()
    assert n.enabled and n.watchdog_interval_s == pytest.approx(0.1)
    drive_like_a_daemon(n)
    n.close()
    got = [m for m, _ in notify_socket.messages()]
    assert got[0] == "READY=1\nSTATUS=started: 4 GPUs"
    assert got[-2:] == ["STATUS=ticks=35 store=ok", "STOPPING=1"]
    pings = got[1:-2]
    assert set(pings) == {"WATCHDOG=1"}
    assert 2 <= len(pings) <= 5, got  # ~35 loop ticks in 0.35 s, pings only every 0.1 s (4 on time)


def test_pings_from_another_thread_carry_the_main_pid(notify_socket):
    """NotifyAccess=main accepts datagrams from the main process only; a thread of it is that process."""
    n = Notifier()
    worker = threading.Thread(target=lambda: n.watchdog(force=True))
    worker.start()
    worker.join()
    assert notify_socket.messages() == [("WATCHDOG=1", os.getpid())]


def test_watchdog_period_comes_from_watchdog_usec(notify_socket, monkeypatch):
    monkeypatch.setenv("WATCHDOG_USEC", "30000000")  # WatchdogSec=30
    assert Notifier().watchdog_interval_s == 15.0
    monkeypatch.delenv("WATCHDOG_USEC")
    n = Notifier()
    assert n.watchdog_interval_s is None
    assert n.watchdog() and not n.watchdog()  # without a period: at most one ping a second
    assert n.watchdog(force=True)
    assert [m for m, _ in notify_socket.messages()] == ["WATCHDOG=1", "WATCHDOG=1"]


def test_abstract_namespace_socket(monkeypatch):
    name = f"trimtab-test-{os.getpid()}-{time.monotonic_ns()}"
    receiver = Receiver("\0" + name)
    try:
        monkeypatch.setenv("NOTIFY_SOCKET", "@" + name)
        n = Notifier()
        assert n.ready() and n.watchdog(force=True) and n.stopping()
        assert [m for m, _ in receiver.messages()] == ["READY=1", "WATCHDOG=1", "STOPPING=1"]
    finally:
        receiver.close()


def test_without_notify_socket_everything_is_a_no_op(monkeypatch):
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    n = Notifier()
    assert not n.enabled
    assert not any([n.ready("x"), n.status("x"), n.watchdog(force=True), n.stopping()])
    n.close()


def test_a_vanished_systemd_never_takes_the_daemon_down(notify_socket):
    n = Notifier()
    assert n.ready()
    notify_socket.close()
    os.unlink(os.environ["NOTIFY_SOCKET"])
    assert n.watchdog(force=True) is False and n.stopping() is False  # no exception


def test_no_ping_follows_stopping_even_when_the_signal_lands_inside_a_ping(notify_socket):
    """SIGTERM's handler runs on the main thread between two bytecodes, possibly in the middle of a ping: here it
    is made to land exactly between the ping's check and its send. STOPPING still comes last."""
    n = Notifier()
    real_send = n.send

    def send_with_a_signal_landing(message: str, wait_s: float = 0.0) -> bool:
        if message == "WATCHDOG=1" and not n._stop_requested:
            n.stopping()  # what install_stop_handlers' handler calls
        return real_send(message, wait_s)

    n.send = send_with_a_signal_landing
    assert n.ready()
    n.watchdog(force=True)
    for _ in range(3):  # the loop's last ticks after the signal: silent
        assert n.watchdog(force=True) is False
    assert n.stopping() is False  # the final cleanup's second call sends nothing more
    n.close()
    assert [m for m, _ in notify_socket.messages()] == ["READY=1", "WATCHDOG=1", "STOPPING=1"]


def test_a_stop_from_another_thread_during_pings_from_the_main_loop_is_last(notify_socket):
    n = Notifier()
    pinging = threading.Event()

    def loop():
        # Paced and bounded like a real loop: the receiver here drains only at the end, and the kernel queues at
        # most a handful of datagrams (net.unix.max_dgram_qlen, 10 by default).
        for _ in range(8):
            if n._stopping_sent:
                break
            n.watchdog(force=True)
            pinging.set()
            time.sleep(0.001)

    t = threading.Thread(target=loop)
    t.start()
    pinging.wait(2)
    n.stopping()
    t.join(5)
    n.close()
    got = [m for m, _ in notify_socket.messages()]
    assert got[-1] == "STOPPING=1" and got.count("STOPPING=1") == 1 and set(got[:-1]) == {"WATCHDOG=1"}


def test_a_full_notify_queue_never_stalls_a_ping(notify_socket):
    n = Notifier()
    t0 = time.monotonic()
    sent = [n.watchdog(force=True) for _ in range(40)]  # nobody reads: the kernel queue fills after a few
    assert time.monotonic() - t0 < 1.0 and sent.count(False) > 0  # dropped, not waited for
    n.close()
