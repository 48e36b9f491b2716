"""Paddle's `Schedule1F1B` communication order (paddle/distributed/auto_parallel/pipelining/
schedules.py, 3.3.1), as .pps text with batches: each `_batch_p2p` call is one batch (a call
with a single operation is written as a plain action, which means the same).

Stage s (on rank s) of N runs min(M, N - s) warm-up forwards, each as receive-forward,
forward, send-forward (the last send held back); then, per step, the held forward send
batched with the next backward receive, the backward, and the backward send batched with the
next forward receive; then the remaining backwards.
"""

from __future__ import annotations


def paddle_1f1b_rows(n: int, m: int) -> list[str]:
    rows = []
    for s in range(n):
        out: list[str] = []

        def recv_f(i: int) -> list[str]:
            return [] if s == 0 else [f"{s}RECV_F{i}"]

        def send_f(i: int) -> list[str]:
            return [] if s == n - 1 else [f"{s}SEND_F{i}"]

        def recv_b(i: int) -> list[str]:
            return [] if s == n - 1 else [f"{s}RECV_B{i}"]

        def send_b(i: int) -> list[str]:
            return [] if s == 0 else [f"{s}SEND_B{i}"]

        def batch(ops: list[str]) -> None:
            if len(ops) == 1:
                out.append(ops[0])
            elif ops:
                out.append("<" + " ".join(ops) + ">")

        warmup = min(m, n - s)
        f = b = 0
        fwd_sends: list[str] = []
        for _ in range(warmup):
            batch(recv_f(f))
            out.append(f"{s}F{f}")
            fwd_sends = send_f(f)
            if f != warmup - 1:
                batch(fwd_sends)
            f += 1
        while True:
            batch(fwd_sends + recv_b(b))
            out.append(f"{s}B{b}")
            bwd_sends = send_b(b)
            b += 1
            if f == m:
                break
            batch(bwd_sends + recv_f(f))
            out.append(f"{s}F{f}")
            fwd_sends = send_f(f)
            f += 1
        batch(bwd_sends)
        while b < m:
            batch(recv_b(b))
            out.append(f"{s}B{b}")
            batch(send_b(b))
            b += 1
        rows.append(f"rank {s}: " + " ".join(out))
    return rows


def paddle_1f1b_text(n: int, m: int) -> str:
    head = (f"# Paddle 3.3.1 Schedule1F1B, {n} ranks, {m} microbatches: its send/recv order, one batch per\n"
            "# _batch_p2p call. Deadlocks under rendezvous (gloo: both sides send first); fine under grouped (NCCL).\n"
            f"pipeline ranks={n} microbatches={m}\n\n")
    return head + "\n".join(paddle_1f1b_rows(n, m)) + "\n"


if __name__ == "__main__":  # regenerate the data files
    from pathlib import Path

    data = Path(__file__).parent / "data"
    for n, m in ((2, 4), (4, 8)):
        (data / f"paddle_1f1b_{n}ranks.pps").write_text(paddle_1f1b_text(n, m))
