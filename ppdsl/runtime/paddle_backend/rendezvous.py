"""Joining Paddle's store without its retry pause.

A rank other than 0 connects to the store rank 0 serves (`init_parallel_env`); when it comes
before the store listens, Paddle's client waits about 3 s before it tries again, which ranks
started together on one machine meet about every other start. Each such rank first waits
here, in short polls, until the store's port accepts a connection, and then joins at once.
The wait is bounded: past it, Paddle's own joining (with its own limits and errors) goes on
as before.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Mapping

POLL_SECONDS = 0.02
WAIT_SECONDS = 60.0  # beyond a slow start-up of rank 0 (importing paddle: 1-3 s here)


def store_endpoint(env: Mapping[str, str]) -> tuple[str, int] | None:
    """Where the store is, read as `init_parallel_env` reads it: `MASTER_ADDR` and
    `MASTER_PORT`, else `PADDLE_MASTER`, else the first of `PADDLE_TRAINER_ENDPOINTS`."""
    addr, port = env.get("MASTER_ADDR"), env.get("MASTER_PORT")
    if addr and port:
        endpoint = f"{addr}:{port}"
    else:
        endpoint = env.get("PADDLE_MASTER") or env.get("PADDLE_TRAINER_ENDPOINTS", "").split(",")[0]
    host, _, number = endpoint.rpartition(":")
    if not host or not number.isdigit():
        return None
    return host, int(number)


def wait_for_store(env: Mapping[str, str] = os.environ, limit: float = WAIT_SECONDS) -> bool:
    """On a rank other than 0: until the store accepts a connection, or `limit` seconds.
    Whether it did (True at once on rank 0 or where the endpoint is not named)."""
    where = store_endpoint(env)
    if where is None or env.get("PADDLE_TRAINER_ID", "0") == "0":
        return True
    deadline = time.monotonic() + limit
    while True:
        try:
            with socket.create_connection(where, timeout=1.0):
                return True
        except OSError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(POLL_SECONDS)


def sockets() -> dict[int, str]:
    """This process's open sockets: descriptor -> `socket:[inode]` (empty where /proc is not
    there). The inode tells a new socket from an old one whose descriptor number was reused."""
    found: dict[int, str] = {}
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return found
    for name in names:
        try:
            link = os.readlink(f"/proc/self/fd/{name}")
        except OSError:  # closed since the listing (the listing's own descriptor)
            continue
        if link.startswith("socket:"):
            found[int(name)] = link
    return found


def opened_since(before: dict[int, str]) -> set[int]:
    """The descriptors of the sockets opened since `before = sockets()`."""
    seen = set(before.values())
    return {fd for fd, link in sockets().items() if link not in seen}


def no_delay(fds: set[int], port: int) -> int:
    """Set TCP_NODELAY on those of `fds` that are connections to `port`; how many.

    Paddle's store client writes a request in several small writes without it, so Nagle's
    algorithm meets the server's delayed acknowledgement: measured on loopback, 42 ms for an
    `add` and 88 ms for a `get`, against 0.05 ms with it. Only a connection of ppdsl's own is
    changed: Paddle's gloo groups are set up through the global one, and faster there they
    were seen to connect before their peer listened."""
    done = 0
    for fd in fds:
        try:
            copy = os.dup(fd)
        except OSError:  # already closed
            continue
        try:
            sock = socket.socket(fileno=copy)
        except OSError:  # not a socket
            os.close(copy)
            continue
        try:
            if sock.type == socket.SOCK_STREAM and sock.family in (socket.AF_INET, socket.AF_INET6) \
                    and sock.getpeername()[1] == port:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                done += 1
        except OSError:
            pass
        finally:
            sock.close()
    return done
