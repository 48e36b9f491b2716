"""Joining Paddle's store: where it is read from, and the wait for it to listen."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("paddle")

from ppdsl.runtime.paddle_backend.rendezvous import store_endpoint, wait_for_store  # noqa: E402


@pytest.mark.parametrize(("env", "where"), [
    ({"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "6170", "PADDLE_MASTER": "10.0.0.2:1"}, ("10.0.0.1", 6170)),
    ({"PADDLE_MASTER": "10.0.0.2:7000", "PADDLE_TRAINER_ENDPOINTS": "10.0.0.3:1"}, ("10.0.0.2", 7000)),
    ({"MASTER_ADDR": "10.0.0.1", "PADDLE_TRAINER_ENDPOINTS": "127.0.0.1:6170,127.0.0.1:6171"}, ("127.0.0.1", 6170)),
    ({}, None),
    ({"PADDLE_MASTER": "no-port"}, None),
])
def test_the_store_is_where_paddle_looks_for_it(env: dict[str, str], where: tuple[str, int] | None) -> None:
    assert store_endpoint(env) == where


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_rank_waits_until_the_store_listens_and_no_longer() -> None:
    port = _free_port()
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "PADDLE_TRAINER_ID": "1"}
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)

    def listen_later() -> None:
        time.sleep(0.5)
        server.bind(("127.0.0.1", port))
        server.listen()

    t0 = time.monotonic()
    thread = threading.Thread(target=listen_later)
    thread.start()
    try:
        assert wait_for_store(env, limit=30.0)
        waited = time.monotonic() - t0
    finally:
        thread.join()
        server.close()
    assert 0.4 < waited < 2.0  # joined soon after it listened, not after a retry pause


def test_the_wait_is_bounded_and_rank_0_does_not_wait() -> None:
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()), "PADDLE_TRAINER_ID": "1"}
    t0 = time.monotonic()
    assert not wait_for_store(env, limit=0.3)
    assert time.monotonic() - t0 < 5.0
    t0 = time.monotonic()
    assert wait_for_store({**env, "PADDLE_TRAINER_ID": "0"}, limit=30.0)
    assert time.monotonic() - t0 < 0.1


def test_only_the_notes_own_connection_to_the_store_loses_nagles_delay() -> None:
    # Paddle's store client without TCP_NODELAY waits ~40 ms a request (Nagle against delayed
    # acknowledgements); ppdsl sets it on the connection it opens for its notes, and on no other.
    from ppdsl.runtime.paddle_backend.rendezvous import no_delay, opened_since, sockets

    if not Path("/proc/self/fd").is_dir():
        pytest.skip("no /proc/self/fd here")
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        old = socket.create_connection(("127.0.0.1", port))
        before = sockets()
        new = socket.create_connection(("127.0.0.1", port))
        try:
            assert opened_since(before) == {new.fileno()}
            assert no_delay(opened_since(before) | {server.fileno()}, port) == 1  # the listener is no connection
            assert new.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
            assert not old.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
        finally:
            new.close()
            old.close()
