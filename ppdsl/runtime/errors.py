"""What the runtime raises: located failures of a step, and set-up refusals."""

from __future__ import annotations


class StepError(RuntimeError):
    """An action failed: names the rank, step and action."""

    def __init__(self, rank: int, step: int, action: str, message: str, peer: bool = False):
        self.rank, self.step, self.action, self.detail = rank, step, action, message
        self.peer = peer  # the transport failed: the cause may be another rank
        super().__init__(f"rank {rank}, step {step}, action {action}: {message}")


class MessageOrderError(StepError):
    """A receive got the message of another action than the one it expects (label guard)."""


class SetupError(RuntimeError):
    """The model, data or program cannot run; raised before any schedule communication."""


class PeerError(RuntimeError):
    """A send or receive failed (gloo timeout, broken connection, a note that never came)."""
