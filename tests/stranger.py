"""A process of the host attacking the refresh's ports (tests only): it watches a folder where the
workers announce each port they listen on (``*.port``: what scanning the host's listening sockets
finds), and hits every one, over and over until stopped, the ways a stranger would: connect and
say nothing, send junk, send a well-formed hello of a made-up session claiming each rank, and
announce an enormous frame."""

from __future__ import annotations

import os
import socket
import struct
import threading
import time
from pathlib import Path

MAGIC = b"TPLRFSH\x02"  # the protocol's opening bytes (refresh/rendezvous.py), as a sniffer learns
HELLO = struct.Struct("<8s16sII32s")


class Stranger(threading.Thread):
    def __init__(self, folder: Path) -> None:
        super().__init__(daemon=True)
        self.folder, self.stop, self.hits = folder, threading.Event(), {}
        self._lock = threading.Lock()

    def run(self) -> None:
        seen: set[int] = set()
        workers = []
        while not self.stop.is_set():
            for f in self.folder.glob("*.port"):
                try:
                    port = int(f.read_text())
                except ValueError:
                    continue
                if port not in seen:
                    seen.add(port)
                    t = threading.Thread(target=self._hammer, args=(port,), daemon=True)
                    t.start()
                    workers.append(t)
            time.sleep(0.01)
        for t in workers:
            t.join(5)

    def _hammer(self, port: int) -> None:
        k = 0
        while not self.stop.is_set():
            claim = k % 6
            hello = HELLO.pack(MAGIC, os.urandom(16), claim, 0, os.urandom(32))
            payload = [
                b"",
                os.urandom(4096),
                hello,
                hello + os.urandom(32) + (1 << 62).to_bytes(8, "little"),
            ][k % 4]
            k += 1
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
                    s.settimeout(0.5)
                    if payload:
                        s.sendall(payload)
                    with self._lock:
                        self.hits[port] = self.hits.get(port, 0) + 1
                    s.recv(64)
            except OSError:
                time.sleep(0.01)
