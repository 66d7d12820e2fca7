"""One control cycle through `Backend.forward`, logits on the host: the numpy backend's cycle.

The same contract as CudaBackend.run_cycle_tokens (model/backend.py): prefill
the rows, choose token 0 as the argmax over the action bins of the last row's
logits, then n_tokens - 1 single-token decode steps, step j feeding token j
at decode_positions[j] into decode_slots[j] and attending to everything
before it. On the GPU the same loop over the CUDA backend's `forward` is the
reference the device cycle is tested against (test/test_cuda_engine.py).
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from .errors import NonFiniteLogitsError


@dataclass
class HostCycle:
    tokens: np.ndarray              # [n_tokens] int64 chosen token ids
    prefill_logits: np.ndarray      # [vocab] float32 logits of the last prefill row
    prefill_ms: float
    decode_ms: float


def restricted_argmax(logits: np.ndarray, bin_lo: int, n_bins: int) -> int:
    """Vocabulary id of the highest-scoring action bin of one logits row [vocab] (first on ties);
    NonFiniteLogitsError for NaN anywhere or +-Inf among the bins."""
    bins = logits[bin_lo:bin_lo + n_bins]
    if np.isnan(logits).any() or not np.isfinite(bins).all():
        raise NonFiniteLogitsError(f"logits contain {int(np.isnan(logits).sum())} NaN values and "
                                   f"{int(np.isinf(bins).sum())} infinite action-bin values")
    return bin_lo + int(np.argmax(bins))


def run_cycle_on_host(backend, prefill_x, positions, write_slots, context_slots, decode_slots, decode_positions,
                      bin_lo: int, n_tokens: int, n_bins: int, give_up=None) -> HostCycle:
    """The cycle as a loop of backend.forward calls (see the module docstring); `give_up` as in
    Backend.run_cycle_tokens."""
    t_prefill = time.perf_counter()
    out = backend.forward(prefill_x, positions, write_slots, context_slots, logits="last")
    prefill_logits = out.logits[-1]                                          # [vocab]
    tokens = [restricted_argmax(prefill_logits, bin_lo, n_bins)]
    t_decode = time.perf_counter()
    ctx = np.concatenate([context_slots, write_slots]).astype(np.int32)
    steps = len(decode_slots[:n_tokens - 1])
    for j, (slot, pos) in enumerate(zip(decode_slots[:n_tokens - 1], decode_positions[:n_tokens - 1])):
        if give_up is not None and give_up(j, steps - j, (time.perf_counter() - t_decode) * 1e3):
            break
        slot = np.asarray([slot], dtype=np.int32)
        out = backend.forward(backend.embed(np.asarray(tokens[-1:], dtype=np.int64)),
                              np.asarray([pos], dtype=np.int64), slot, ctx, logits="last")
        tokens.append(restricted_argmax(out.logits[-1], bin_lo, n_bins))
        ctx = np.concatenate([ctx, slot])
    t_end = time.perf_counter()
    return HostCycle(np.asarray(tokens, dtype=np.int64), prefill_logits, (t_decode - t_prefill) * 1e3,
                     (t_end - t_decode) * 1e3)


class HostLoopCycles:
    """`run_cycle_tokens`, `prefill_logits` and `last_cycle_ms` of the Backend protocol, as the loop of
    `self.forward` calls above: the numpy backend's cycle, and (for tests) any object with forward/embed."""

    last_cycle_ms: tuple | None = None          # (prefill, decode) of the latest cycle
    _host_prefill_logits: np.ndarray | None = None

    def run_cycle_tokens(self, prefill_x, positions, write_slots, context_slots, decode_slots, decode_positions,
                         action_bin_lo: int, n_tokens: int, n_bins: int, give_up=None) -> np.ndarray:
        self._host_prefill_logits = None
        cycle = run_cycle_on_host(self, prefill_x, positions, write_slots, context_slots, decode_slots,
                                  decode_positions, action_bin_lo, n_tokens, n_bins, give_up)
        self._host_prefill_logits = cycle.prefill_logits
        self.last_cycle_ms = (cycle.prefill_ms, cycle.decode_ms)
        return cycle.tokens

    def prefill_logits(self) -> np.ndarray:
        """[vocab] logits of the last prefill row of the latest cycle."""
        if self._host_prefill_logits is None:
            raise RuntimeError("prefill_logits: no cycle has completed yet")
        return self._host_prefill_logits
