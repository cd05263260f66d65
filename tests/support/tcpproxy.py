"""A loopback TCP forwarder that tests can cut and restore, to make a real server unreachable for a while.

`stop()` closes the listening socket and every open connection (clients see resets / refused connections, as
when a database host goes away); `start()` listens again on the same port.
"""

from __future__ import annotations

import socket
import threading


class TcpProxy:
    def __init__(self, target_host: str, target_port: int, listen_port: int = 0):
        self.target = (target_host, target_port)
        self.port = listen_port
        self._listener: socket.socket | None = None
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()
        self._running = False

    def start(self) -> "TcpProxy":
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", self.port))
        s.listen(64)
        self.port = s.getsockname()[1]
        self._listener = s
        self._running = True
        threading.Thread(target=self._accept, args=(s,), daemon=True).start()
        return self

    def _accept(self, listener: socket.socket) -> None:
        while self._running:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._conns += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def stop(self) -> None:
        self._running = False
        if self._listener is not None:
            try:  # wakes the accept() blocked in the other thread; close() alone would leave it listening
                self._listener.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self._listener.close()
            self._listener = None
        with self._lock:
            conns, self._conns = self._conns, []
        for c in conns:
            # shutdown() first: it wakes the pipe thread blocked in recv() (a bare close() would wait for it)
            # and the peer sees the connection end, as when a database host goes away.
            for op in (lambda: c.shutdown(socket.SHUT_RDWR), c.close):
                try:
                    op()
                except OSError:
                    pass
