"""What a failed send or receive is reported as (paddle-free: the messages are gloo's)."""

from __future__ import annotations

from ppdsl.runtime.transport.comm import GLOO_TIMEOUT_SECONDS, peer_error

# The texts gloo 3.3.1 raised on loopback when the peer was SIGKILLed mid-send (both seen).
GLOO_TIMEOUT = "[/paddle/third_party/gloo/gloo/transport/tcp/pair.cc:584] TIMEOUT self_rank = 0 pair_rank = 1"
GLOO_RESET = "[/paddle/third_party/gloo/gloo/transport/tcp/pair.cc:576] Read error [127.0.0.1]:17323: Connection reset by peer"


def test_a_quick_gloo_timeout_is_a_lost_peer_not_gloos_limit() -> None:
    message = str(peer_error(RuntimeError(GLOO_TIMEOUT), "sending to", 1, 0.2))
    assert message.startswith("lost rank 1 while sending to it")
    assert "after 0.2 s" in message and "30 s limit" in message


def test_a_timeout_at_gloos_limit_says_the_transport_gave_up() -> None:
    message = str(peer_error(RuntimeError(GLOO_TIMEOUT), "receiving from", 3, GLOO_TIMEOUT_SECONDS))
    assert message.startswith("the transport gave up receiving from rank 3 after 30 s")


def test_a_reset_connection_is_a_lost_peer() -> None:
    assert str(peer_error(RuntimeError(GLOO_RESET), "exchanging with", 2, 0.1)).startswith(
        "lost rank 2 while exchanging with it (connection reset)")


def test_another_failure_keeps_gloos_first_line() -> None:
    message = str(peer_error(RuntimeError("enforce failed: bad size\nmore"), "sending to", 1, 0.0))
    assert message == "sending to rank 1 failed: enforce failed: bad size"
