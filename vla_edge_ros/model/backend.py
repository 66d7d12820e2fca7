"""The interface every transformer backend implements (numpy reference, PyCUDA).

The KV cache is an arena of `capacity` physical slots allocated once. Which
slot holds which token is decided by the caller (core/kv_slots.py): a backend
only writes K/V into the slots it is told to and attends over the slots it is
told to. Evicted frames therefore leave holes that cost nothing.

One call, `forward`, serves prefill (N tokens) and decode (N = 1):

    x            [N, hidden]      input embeddings (token rows from `embed`,
                                  or vision-encoder rows), float32
    positions    [N] int64        absolute RoPE position of each input row
    write_slots  [N] int32        arena slot receiving each row's K/V
    context_slots[C] int32        already-filled slots every row attends to
                                  (in addition to rows 0..i of this call:
                                  causal within the call)
    logits       "last" | "all" | "none"

    returns ForwardResult(logits [1 or N, vocab] float32 or None,
                          hidden_states list of [N, hidden] per layer, only
                          when return_hidden=True: entry 0 = input
                          embeddings, entry l = output of layer l, last entry
                          = after the final norm, as HF's output_hidden_states)

K is stored after RoPE, so a slot keeps the position it was written with.
A backend built with kv_dtype "bfloat16" (config kv.dtype) stores every K and V
value rounded to bf16 (nearest even); its host copies stay float32 arrays.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from .spec import ModelSpec


@dataclass
class ForwardResult:
    logits: np.ndarray | None                 # [1, vocab] ("last") or [N, vocab] ("all")
    hidden_states: list = field(default_factory=list)


class Backend(Protocol):
    """Everything the engine (core/engine.py, core/engine_state.py) and the reconciler call on a backend."""

    spec: ModelSpec
    capacity: int                              # KV arena slots
    max_rows: int                              # rows one cycle prefill may have (the CUDA pass size)
    device: object                             # cuda_device.CudaDevice of a GPU backend; None on the CPU
    last_cycle_ms: tuple | None                # (prefill ms, decode ms) of the latest run_cycle_tokens

    def embed(self, token_ids: np.ndarray) -> np.ndarray:
        """[N] int -> [N, hidden] float32 rows of the token embedding table."""

    def forward(self, x: np.ndarray, positions: np.ndarray, write_slots: np.ndarray,
                context_slots: np.ndarray, logits: str = "last",
                return_hidden: bool = False) -> ForwardResult:
        """See the module docstring."""

    def run_cycle_tokens(self, prefill_x: np.ndarray, positions: np.ndarray, write_slots: np.ndarray,
                         context_slots: np.ndarray, decode_slots: np.ndarray, decode_positions: np.ndarray,
                         action_bin_lo: int, n_tokens: int, n_bins: int, give_up=None) -> np.ndarray:
        """One control cycle: prefill rows -> token 0 (argmax over the action bins of the last row's logits)
        -> n_tokens - 1 decode steps, step j feeding token j at decode_positions[j] into decode_slots[j].
        Returns [n_tokens] int64 token ids; NonFiniteLogitsError (model/errors.py) on NaN/Inf logits.
        Sets last_cycle_ms. The CUDA backend keeps it all on the device (one host sync).
        give_up(steps_done, steps_left, decode_ms_so_far) -> bool, where given, is asked by a host-loop backend
        before each decode step: True stops the cycle there and returns the tokens chosen so far (fewer than
        n_tokens). The CUDA backend's cycle is one device graph and runs to its end."""

    def prefill_logits(self) -> np.ndarray:
        """[vocab] float32 logits of the last prefill row of the latest run_cycle_tokens (RuntimeError before one)."""

    def prepare_cycle(self, prefill_rows: int, action_bin_lo: int, n_bins: int) -> None:
        """Get ready for cycles with this prefill length (CUDA: capture their graphs) without running one."""

    def prepare_forward(self, row_counts) -> None:
        """Get ready for `forward` calls of these total row counts (CUDA: capture the graphs of their passes)
        without running one: a first call of a new row count would otherwise pay the capture (tens of ms on
        the H200) inside whatever budget it runs in (a reconciler's slack window, a swap at a boundary)."""

    def copy_slots(self, src_slots: np.ndarray, dst_slots: np.ndarray) -> None:
        """Move K/V of src slots into dst slots (all layers); used by compaction and swaps."""

    def read_kv(self, slots: np.ndarray) -> np.ndarray:
        """[2, layers, len(slots), kv_dim] float32 host copy of K (after RoPE) and V of the slots."""

    def write_kv(self, slots: np.ndarray, kv: np.ndarray) -> None:
        """Inverse of read_kv: overwrite the slots with kv [2, layers, len(slots), kv_dim] (rounded to bf16
        by a bf16 arena)."""

    def memory_bytes(self) -> int:
        """Bytes held by weights + KV arena (device memory for GPU backends)."""

    def synchronize(self) -> None:
        """Wait until the work queued so far has finished (a GPU backend queues asynchronously)."""

    def close(self) -> int:
        """Free the backend's memory now (device memory for GPU backends); returns the bytes freed."""


class KvPayload(Protocol):
    """A snapshot's KV rows [2, layers, rows, kv_dim], wherever they are: `HostKV` (a host array: the numpy
    reconciler, a snapshot file), `cuda_state_transfer.DeviceKV` (left on the reconciler's device in the same
    process) or `cuda_ipc.IpcKV` (mapped from the reconciler's process). The swap uses only these."""

    shape: tuple
    on_device: bool             # the rows are not in host memory: the offer carries an IPC descriptor for them

    def all_finite(self) -> bool:
        """No NaN or Inf among the rows (on a device: from the sum taken at export)."""

    def check_usable(self) -> None:
        """model.errors.DeviceKVUnavailable when the rows are no longer this snapshot's (a reused buffer)."""

    def write_into(self, backend, slots: np.ndarray) -> None:
        """The rows into `slots` of `backend`'s arena (device to device where both are on a GPU)."""

    def start_write(self, backend, slots: np.ndarray) -> "KvWrite":
        """write_into in two halves: queue the copy now, `finish()` the returned KvWrite later (the swap queues
        its late frames' recompute in between, so the copy runs on the device while the host does that)."""


class KvWrite(Protocol):
    """A queued KV copy (KvPayload.start_write)."""

    def finish(self) -> None:
        """Wait for the copy; model.errors.DeviceKVUnavailable when what it copied was not the snapshot's."""


class FinishedWrite:
    """KvWrite of a copy that was complete when start_write returned (host rows, a same-process device copy)."""

    def finish(self) -> None:
        """Nothing left to wait for."""


FINISHED = FinishedWrite()


class HostKV:
    """KvPayload of rows in host memory."""

    on_device = False

    def __init__(self, rows: np.ndarray):
        self.rows = rows
        self.shape = rows.shape

    def all_finite(self) -> bool:
        return bool(np.isfinite(self.rows).all())

    def check_usable(self) -> None:
        """Host rows are the snapshot's own: always usable."""

    def write_into(self, backend, slots: np.ndarray) -> None:
        backend.write_kv(np.asarray(slots), self.rows)

    def start_write(self, backend, slots: np.ndarray) -> FinishedWrite:
        self.write_into(backend, slots)
        return FINISHED


def kv_payload(kv) -> KvPayload | None:
    """A snapshot's `kv` as a KvPayload: a host array wrapped in HostKV, a device payload as it is, None as None."""
    if kv is None:
        return None
    return HostKV(kv) if isinstance(kv, np.ndarray) else kv
