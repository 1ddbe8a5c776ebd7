"""The wire of `raylight run`'s agent channel, between a rank's agent (the raylight
worker that started the script) and the script's process: length-prefixed frames on a
local TCP connection, opened by a challenge and response on the run's key (HMAC-SHA256,
each side proving it holds the key; the key itself never travels).

Standard library only, and no raylight import: ``launch/bootstrap.py``, the script's
first code, loads this file by its path (the child imports nothing of raylight before the
script does). The script's ``raylight.run_context()`` (``run_channel.py``) and the agent
(``launch/agent.py``) import it as a module.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import socket

CHANNEL_ENV = "RAYLIGHT_RUN_CHANNEL"  # host:port of the agent's listener
KEY_ENV = "RAYLIGHT_RUN_AUTHKEY"  # hex; the listener's authentication key
HELLO = b"raylight-run-channel/1 "  # the agent's challenge: this, then a 32-byte nonce
CONNECT_TIMEOUT_S = 60.0  # the script's wait for the agent's part of the handshake
_HANDSHAKE_LIMIT = 4096  # the most a frame may hold before a connection is authenticated


class ChannelRefused(ConnectionError):
    """The agent channel refused this connection (a wrong or missing key), or what
    answered is not the run's agent."""


def proof(key: bytes, role: bytes, nonce: bytes) -> bytes:
    """What a side holding ``key`` answers to ``nonce`` (``role``: b"script" or b"agent",
    so neither answer can be replayed as the other)."""
    return hmac.new(key, HELLO + role + nonce, hashlib.sha256).digest()


def send_frame(sock: socket.socket, data: bytes) -> None:
    sock.sendall(len(data).to_bytes(8, "big"))
    sock.sendall(data)


def recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = sock.recv_into(view[got:])
        if k == 0:
            raise EOFError("the agent channel's other end closed the connection")
        got += k
    return bytes(buf)


def recv_frame(sock: socket.socket, limit: int | None = None) -> bytes:
    size = int.from_bytes(recv_exact(sock, 8), "big")
    if limit is not None and size > limit:
        raise ChannelRefused(f"a frame of {size} bytes where at most {limit} may come")
    return recv_exact(sock, size)


def connect(address: str, key: bytes, timeout_s: float = CONNECT_TIMEOUT_S) -> socket.socket:
    """A connection to the agent channel at ``host:port``, authenticated both ways with
    ``key``. Raises ChannelRefused (a wrong key, or not the run's agent), TimeoutError."""
    host, port = address.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=timeout_s)
    try:
        challenge = recv_frame(sock, _HANDSHAKE_LIMIT)
        if not challenge.startswith(HELLO) or len(challenge) != len(HELLO) + 32:
            raise ChannelRefused(f"{address} is not a raylight run agent channel")
        mine = os.urandom(32)
        send_frame(sock, proof(key, b"script", challenge[len(HELLO):]) + mine)
        answer = recv_frame(sock, _HANDSHAKE_LIMIT)
        if answer[:2] == b"no":
            raise ChannelRefused(f"the agent channel at {address} refused this connection: {answer[2:].decode(errors='replace')}")
        if answer[:2] != b"ok" or not hmac.compare_digest(answer[2:], proof(key, b"agent", mine)):
            raise ChannelRefused(f"what answers at {address} does not hold this run's key: not the run's agent")
    except TimeoutError:
        sock.close()
        raise TimeoutError(f"the agent channel at {address} did not answer within {timeout_s:g} s") from None
    except BaseException:
        sock.close()
        raise
    sock.settimeout(None)  # the agent's replies take as long as the driver's work
    return sock
