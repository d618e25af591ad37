"""Prefill beside the decode steps (GPU): a prompt admitted while other rows decode is prefilled on a stream of
its own, so the steps launched meanwhile run beside it rather than behind it.

Between two steps, a prefill stalls every running row for its whole length (the 8B shape: a ~300-token prompt
takes ~12 ms, a step of 32 rows ~7 ms). Beside them, the GPU may overlap the steps' weight reads with the
prefill's compute. Measured on the 8B shape (README): the first tokens come sooner, the throughput is the same.

Why it is safe, the rows' state being shared with the steps in flight:
- The prefill starts after every step launched before it (the stream waits for the main one), so no step that
  still took the slot for a running row, or as padding at position 0, writes its cache while the prompt does.
- Steps launched later take the slot as padding (inactive: their commit leaves its state alone): they write
  K/V at its `start`, set to the padded prompt length P first, past every position the prompt writes; the
  first real step rewrites those positions before any query reads them. Hence P + B <= max_len (`fits`).
- The slot's state (start, anchor, active) is set on the main stream once the prefill is done (`ready`),
  behind an event wait: only the prefill's own buffers (`pre_in`, `pre_tok`, a pinned row per slot) are
  written on this stream, and its graphs have their own memory pool (runner.pre_pool), split-K lane and
  capture stream (cuBLAS keeps a workspace per stream, and a graph replays the one it was captured with).
- The logits row it writes may be overwritten by a step's padding row: requests that want logprobs are
  prefilled in line (`FastEngine.add_many`).
"""

from __future__ import annotations

import torch

from dflash_bench.engine.fast.prefill import stage


class BackgroundPrefill:
    """Prompts being prefilled on a side stream, per slot: begun by `begin`, admitted by `ready`."""

    def __init__(self, runner):
        self.r = runner
        self.stream = torch.cuda.Stream(runner.dev)
        # per slot its prompt's inputs (slot, last index, ids), read by the copy on the stream: one row each, so
        # that a later prompt's inputs do not overwrite an earlier one's before its copy ran
        self.host = torch.zeros(runner.S, 2 + runner.max_len, dtype=torch.long, pin_memory=True)
        self.tok = torch.zeros(runner.S, dtype=torch.long, device=runner.dev)
        self.tok_host = torch.zeros(runner.S, dtype=torch.long, pin_memory=True)
        self.pending: dict[int, tuple[int, torch.cuda.Event]] = {}  # slot -> (prompt length, done), oldest first

    def fits(self, prompt: list[int]) -> bool:
        return 0 < len(prompt) and self.r.padded(len(prompt)) + self.r.B <= self.r.max_len

    def begin(self, slot: int, prompt: list[int]) -> None:
        """Enqueue the prefill of `prompt` into `slot` (free, and `fits`); returns at once."""
        r, P = self.r, self.r.padded(len(prompt))
        row = self.host[slot]
        stage(row, [slot], [prompt], P)
        r.start[slot] = P  # main stream: steps launched from now on write this slot's padding K/V past the prompt
        self.stream.wait_stream(torch.cuda.current_stream(r.dev))
        with torch.cuda.stream(self.stream):
            r.pre_in[:2 + P].copy_(row[:2 + P], non_blocking=True)
            r.prefill_graph(P)
            self.tok[slot:slot + 1].copy_(r.pre_tok[:1])
            self.tok_host[slot:slot + 1].copy_(r.pre_tok[:1], non_blocking=True)
            done = torch.cuda.Event()
            done.record()
        self.pending[slot] = (len(prompt), done)

    def ready(self, wait: bool = False) -> dict[int, int]:
        """Admit the slots whose prefill is done (with `wait`, at least the oldest, waiting for it): their state is
        set on the main stream behind the prefill, so the next step launched may take them. Returns each one's
        first token."""
        r, out = self.r, {}
        main = torch.cuda.current_stream(r.dev)
        for slot, (n, done) in list(self.pending.items()):
            if wait and not out:
                done.synchronize()
            if not done.query():
                break  # one stream: the later ones are not done either
            main.wait_event(done)
            del self.pending[slot]
            r.admit(slot, n, self.tok[slot])
            out[slot] = int(self.tok_host[slot])
        return out

    def drop(self, slot: int) -> None:
        """Forget a slot's prefill (its request went away). It still runs, into the free slot: what the main stream
        runs from now on (a new prompt's prefill into that slot among them) waits for it."""
        got = self.pending.pop(slot, None)
        if got is not None:
            torch.cuda.current_stream(self.r.dev).wait_event(got[1])

    def join(self) -> None:
        """Make the main stream wait for every prefill begun (before it reuses their input buffers)."""
        if self.pending:
            torch.cuda.current_stream(self.r.dev).wait_stream(self.stream)
