"""Length-prefixed JSON messages over a stream socket: how the sim's processes talk (no pickle).

Why not multiprocessing queues: they pickle, and nothing that crosses a process in sgl-seat may. Every
message is a plain JSON object with a short type tag ``"t"``. Sending is thread-safe; receiving is done
by one reader thread per channel.
"""

from __future__ import annotations

import contextlib
import json
import socket
import struct
import threading
from typing import Any

_HEADER = struct.Struct("!I")
MAX_MESSAGE = 64 << 20

Message = dict[str, Any]


class ChannelClosed(Exception):
    """The other end went away."""


class Channel:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._send_lock = threading.Lock()

    @classmethod
    def from_fd(cls, fd: int) -> Channel:
        return cls(socket.socket(fileno=fd))

    def send(self, msg: Message) -> None:
        data = json.dumps(msg, separators=(",", ":")).encode()
        try:
            with self._send_lock:
                self.sock.sendall(_HEADER.pack(len(data)) + data)
        except OSError as e:
            raise ChannelClosed(str(e)) from e

    def recv(self) -> Message:
        """Block for the next message; raise :class:`ChannelClosed` at end of stream."""
        (size,) = _HEADER.unpack(self._read(_HEADER.size))
        if size > MAX_MESSAGE:
            raise ChannelClosed(f"message of {size} bytes is over the limit")
        obj = json.loads(self._read(size))
        if not isinstance(obj, dict):
            raise ChannelClosed("message is not a JSON object")
        return obj

    def _read(self, n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            try:
                chunk = self.sock.recv(n - len(buf))
            except OSError as e:
                raise ChannelClosed(str(e)) from e
            if not chunk:
                raise ChannelClosed("end of stream")
            buf += chunk
        return bytes(buf)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
