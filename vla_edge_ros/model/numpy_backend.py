"""Reference transformer in numpy: the CPU backend and the oracle the CUDA kernels are checked against.

INT4 weights (model.weights: int4) arrive dequantized (int4_snapshot.py: w_hat = q * fp16 scale, float32)
and are computed with like any float weights, never rounded to bf16 (dtype bfloat16 rounds the other
tensors: the CUDA INT4 kernels multiply q and the scale exactly); only memory_bytes counts them as a device
stores them.

Implements the Backend protocol of backend.py (read its docstring for the
contract): a KV arena of `capacity` slots allocated once, explicit absolute
RoPE positions, writes into given slots, attention over given context slots
plus the call's own rows (causal within the call). Prefill (N rows) and decode
(N = 1) are the same code path.

Math follows HF Qwen2 / Llama in float32: RMSNorm, RoPE in the rotate-half
convention, grouped-query attention (query head h reads KV head h // group),
SwiGLU MLP, optional q/k/v bias, tied or separate output head.

dtype "bfloat16" rounds the weights to bfloat16 values (compute and KV stay
float32): numpy has no bf16 arithmetic, so this reproduces the weight
quantization error of a bf16 model, not its activation rounding.

kv_dtype "bfloat16" rounds every K (after RoPE) and V value to bfloat16 where
it is stored (forward, write_kv), as a bf16 KV arena holds it; the arrays stay
float32 and the attention reads the rounded values back in float32.
"""
from __future__ import annotations

import logging
import math
import time

import numpy as np

from ..config import KV_ELEMENT_BYTES
from .backend import ForwardResult
from . import int4
from .forward_inputs import MAX_POSITION, check_forward_inputs, check_slot_sets, slot_array, token_id_array
from .host_cycle import HostLoopCycles, restricted_argmax
from .layered_forward import LayeredForward, OneLayeredForward
from .spec import ModelSpec
from .weights import ModelWeights, canonical_dtype, round_to_bf16

logger = logging.getLogger(__name__)

# Query rows per attention block: bounds the [kv_heads, group * rows, T] score buffer on long prefills.
ATTENTION_SCORE_ELEMENTS = 1 << 24


class NumpyBackend(HostLoopCycles, OneLayeredForward):
    """Vectorized numpy transformer with a slot-addressed KV arena."""

    device = None                   # no GPU: threads need no context (cuda_device.bound(None) is a no-op)

    def __init__(self, spec: ModelSpec, weights: ModelWeights, capacity: int, dtype=np.float32,
                 kv_dtype: str = "float32"):
        if capacity <= 0:
            raise ValueError(f"capacity must be > 0 KV slots, got {capacity}")
        if len(weights.layers) != spec.num_layers:
            raise ValueError(f"weights have {len(weights.layers)} layers, spec says {spec.num_layers}")
        self.spec = spec
        self.capacity = int(capacity)
        self._slot_marks = np.zeros(self.capacity, dtype=bool)    # scratch for the slot-set checks of forward()
        self.dtype = canonical_dtype(dtype)
        if kv_dtype not in KV_ELEMENT_BYTES:
            raise ValueError(f"kv_dtype must be one of {tuple(KV_ELEMENT_BYTES)}, got {kv_dtype!r}")
        self.kv_dtype = kv_dtype
        if self.dtype == "bfloat16":
            weights = weights.rounded_to_bf16()
        self._weight_bytes = _weight_bytes(weights)
        self._embed = weights.embed                               # [vocab, hidden]
        self._lm_head_t = weights.lm_head.T                       # [hidden, vocab] (view; tied: of embed)
        self._final_norm = weights.final_norm                     # [hidden]
        self._layers = [_FusedLayer(layer) for layer in weights.layers]
        self._tied = weights.tied
        # K after RoPE and V, one row of kv_heads * head_dim per slot.
        self._k = np.zeros((spec.num_layers, self.capacity, spec.kv_dim), np.float32)  # [layers, capacity, kv_dim]
        self._v = np.zeros((spec.num_layers, self.capacity, spec.kv_dim), np.float32)  # [layers, capacity, kv_dim]
        hd = spec.head_dim
        # As HF: float32 inverse frequencies, float32 angle = position * inv_freq.
        self._inv_freq = (1.0 / (np.float32(spec.rope_theta) ** (np.arange(0, hd, 2, dtype=np.float32) / np.float32(hd)))
                          ).astype(np.float32)                   # [head_dim / 2]
        self.max_rows = self.capacity                             # any prefill that fits the arena is one call

    # ------------------------------------------------------------------ Public API

    def embed(self, token_ids: np.ndarray) -> np.ndarray:
        self._require_no_layered("embed")       # as the CUDA backend, whose embedding gathers through its residual rows
        ids = token_id_array(token_ids, self.spec.vocab_size)
        return self._embed[ids]                                   # [N, hidden] (a copy)

    def forward(self, x: np.ndarray, positions: np.ndarray, write_slots: np.ndarray,
                context_slots: np.ndarray, logits: str = "last", return_hidden: bool = False) -> ForwardResult:
        self._require_no_layered("forward")
        x, positions, write_slots, context_slots = self._check_inputs(x, positions, write_slots, context_slots, logits)
        window = _KvWindow(self, context_slots, extra_rows=x.shape[0])
        return self._forward_rows(x, positions, write_slots, window, logits, return_hidden)

    def begin_layered(self, x: np.ndarray, positions: np.ndarray, write_slots: np.ndarray,
                      context_slots: np.ndarray, pieces: int) -> LayeredForward:
        """forward(..., logits="none") in `pieces` runs of layers (model/layered_forward.py); nothing runs yet."""
        self._require_no_layered("begin_layered")
        x, positions, write_slots, context_slots = self._check_inputs(x, positions, write_slots, context_slots,
                                                                      "none")
        run = _LayerRun(self, x, positions, write_slots, _KvWindow(self, context_slots, x.shape[0]))
        lf = self._start_layered(x.shape[0], pieces)
        lf.state["run"] = run
        return lf

    def run_layer_piece(self, lf: LayeredForward) -> bool:
        """The next piece of `lf`'s layers; True once its last piece has run (its K/V all written)."""
        first, end = self._next_layers(lf)
        run = lf.state["run"]
        self._run_layers(run, first, end)
        if not self._piece_ran(lf):
            return False
        run.window.rows += lf.rows
        return True

    def run_cycle_tokens(self, prefill_x, positions, write_slots, context_slots, decode_slots, decode_positions,
                         action_bin_lo: int, n_tokens: int, n_bins: int, give_up=None) -> np.ndarray:
        """The cycle of model/backend.py with the context's K/V gathered once per layer for the whole cycle.

        The same arithmetic as the loop of `forward` calls in host_cycle.py (which stays the reference,
        and is what the tests compare this against): each decode step attends to the same context plus
        the rows written since, so the gathered window grows by one row per step instead of being
        gathered again from the arena (at 1000 cached tokens that gather was most of a decode step).
        """
        self._require_no_layered("run_cycle_tokens")
        self._host_prefill_logits = None
        prefill_x, positions, write_slots, context_slots = self._check_inputs(
            prefill_x, positions, write_slots, context_slots, "last")
        steps = int(n_tokens) - 1
        decode_slots = self._slot_array(np.asarray(decode_slots)[:steps], "decode_slots")     # [steps]
        decode_positions = np.asarray(decode_positions)[:steps]                               # [steps]
        if decode_slots.size != steps or decode_positions.shape != (steps,):
            raise ValueError(f"run_cycle_tokens: {steps} decode steps need as many decode_slots and decode_positions, "
                             f"got {decode_slots.size} and {decode_positions.shape}")
        if steps and (decode_positions.min() < 0 or decode_positions.max() > MAX_POSITION):
            raise ValueError(f"decode_positions must be in [0, 2^31), got [{decode_positions.min()}, "
                             f"{decode_positions.max()}]")
        check_slot_sets(self._slot_marks, np.concatenate([write_slots, decode_slots]), context_slots)
        t_prefill = time.perf_counter()
        window = _KvWindow(self, context_slots, extra_rows=prefill_x.shape[0] + steps)
        prefill_logits = self._forward_rows(prefill_x, positions, write_slots, window, "last", False).logits[-1]
        tokens = [restricted_argmax(prefill_logits, action_bin_lo, n_bins)]               # [vocab] -> id
        t_decode = time.perf_counter()
        for j in range(steps):
            if give_up is not None and give_up(j, steps - j, (time.perf_counter() - t_decode) * 1e3):
                break                                    # the cycle will be late: stop here (Backend protocol)
            x = self._embed[tokens[-1:]]                                                    # [1, hidden]
            out = self._forward_rows(x, decode_positions[j:j + 1], decode_slots[j:j + 1], window, "last", False)
            tokens.append(restricted_argmax(out.logits[-1], action_bin_lo, n_bins))
        t_end = time.perf_counter()
        self._host_prefill_logits = prefill_logits
        self.last_cycle_ms = ((t_decode - t_prefill) * 1e3, (t_end - t_decode) * 1e3)
        return np.asarray(tokens, dtype=np.int64)

    def prepare_cycle(self, prefill_rows: int, action_bin_lo: int, n_bins: int) -> None:
        """Nothing to prepare on the CPU (the CUDA backend captures its graphs here)."""

    def prepare_forward(self, row_counts, pieces: int = 1) -> None:
        """Nothing to prepare on the CPU."""

    def layered_rows_fit(self, rows: int) -> bool:
        """Any forward can run piece by piece here (one call holds any row count)."""
        return True

    def close(self) -> int:
        """Nothing to free early: the arrays go with the object. Returns 0 bytes freed."""
        return 0

    def synchronize(self) -> None:
        """Nothing queued: numpy computes synchronously."""

    def copy_slots(self, src_slots: np.ndarray, dst_slots: np.ndarray) -> None:
        src = self._slot_array(src_slots, "src_slots")
        dst = self._slot_array(dst_slots, "dst_slots")
        if src.shape != dst.shape:
            raise ValueError(f"copy_slots: src_slots {src.shape} and dst_slots {dst.shape} differ in length")
        # Right-hand fancy indexing copies first, so overlapping src/dst sets are safe.
        self._k[:, dst] = self._k[:, src]
        self._v[:, dst] = self._v[:, src]

    def read_kv(self, slots: np.ndarray) -> np.ndarray:
        idx = self._slot_array(slots, "slots")
        return np.stack([self._k[:, idx], self._v[:, idx]])                     # [2, layers, n, kv_dim]

    def write_kv(self, slots: np.ndarray, kv: np.ndarray) -> None:
        idx = self._slot_array(slots, "slots")
        want = (2, self.spec.num_layers, idx.size, self.spec.kv_dim)
        if kv.shape != want:
            raise ValueError(f"write_kv: kv must be {want}, got {kv.shape}")
        if not np.isfinite(kv).all():
            raise ValueError("write_kv: kv contains NaN or Inf")
        self._k[:, idx] = self._kv_stored(kv[0])
        self._v[:, idx] = self._kv_stored(kv[1])

    def memory_bytes(self) -> int:
        # The arena as a device of kv_dtype would hold it: numpy keeps float32 arrays even for bf16 KV,
        # so _k.nbytes would overstate a bf16 arena twice over.
        arena = (self._k.size + self._v.size) * KV_ELEMENT_BYTES[self.kv_dtype]
        return int(self._weight_bytes + arena)

    # ------------------------------------------------------------------ Internal helpers

    def _check_inputs(self, x, positions, write_slots, context_slots, logits):
        return check_forward_inputs(self.spec.hidden_size, self._slot_marks, x, positions, write_slots,
                                    context_slots, logits)

    def _slot_array(self, slots, name: str) -> np.ndarray:
        return slot_array(slots, name, self.capacity)

    def _kv_stored(self, values: np.ndarray) -> np.ndarray:
        """K or V values as the arena stores them: rounded to bf16 (nearest even) for a bf16 arena."""
        return round_to_bf16(values) if self.kv_dtype == "bfloat16" else values

    def _rope_tables(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        angles = positions.astype(np.float32)[:, None] * self._inv_freq[None, :]  # [N, hd / 2]
        angles = np.concatenate([angles, angles], axis=1)                           # [N, hd]
        return np.cos(angles), np.sin(angles)

    def _forward_rows(self, x, positions, write_slots, window: "_KvWindow", logits: str,
                      return_hidden: bool) -> ForwardResult:
        """N validated rows through every layer: K/V written to the arena at write_slots and appended to
        `window`, attention over the window (causal among this call's rows)."""
        spec = self.spec
        run = _LayerRun(self, x, positions, write_slots, window)
        hidden = [run.h.copy()] if return_hidden else []
        self._run_layers(run, 0, spec.num_layers, hidden if return_hidden else None)
        h = run.h
        window.rows = run.t0 + run.n
        if return_hidden:
            # HF's output_hidden_states: the last entry is the final-norm output, not layer L's raw output.
            normed = _rms_norm(h, self._final_norm, spec.rms_norm_eps)  # [N, hidden]
            hidden[-1] = normed
        if logits == "none":
            return ForwardResult(logits=None, hidden_states=hidden)
        rows = h if logits == "all" else h[-1:]
        if return_hidden:
            rows_normed = normed if logits == "all" else normed[-1:]
        else:
            rows_normed = _rms_norm(rows, self._final_norm, spec.rms_norm_eps)
        return ForwardResult(logits=rows_normed @ self._lm_head_t, hidden_states=hidden)  # [1 or N, vocab]

    def _run_layers(self, run: "_LayerRun", first: int, end: int, hidden: list | None = None) -> None:
        """Layers [first, end) over `run`'s residual rows (in place), writing their K/V; hidden: each layer's
        output appended."""
        spec, n, write_slots, window = self.spec, run.n, run.write_slots, run.window
        cos, sin, mask, h = run.cos, run.sin, run.mask, run.h
        k_end = spec.q_dim + spec.kv_dim
        for li in range(first, end):
            layer = self._layers[li]
            a = _rms_norm(h, layer.input_norm, spec.rms_norm_eps)
            qkv = a @ layer.qkv_t                                 # [N, q_dim + 2 kv_dim]
            if layer.qkv_bias is not None:
                qkv += layer.qkv_bias
            # q and k rotated in one call (the same elementwise arithmetic as one call each, half the numpy calls:
            # on a decode step of the CPU model the calls, not the arithmetic, are the cost).
            qk = _apply_rope(qkv[:, :k_end].reshape(n, spec.num_heads + spec.num_kv_heads, spec.head_dim), cos, sin)
            q = qk[:, :spec.num_heads]                            # [N, H, hd]
            # Stored first, then read back: this call's own rows are attended as the arena holds them.
            k_rows = self._kv_stored(qk[:, spec.num_heads:].reshape(n, spec.kv_dim))   # [N, kv_dim]
            v_rows = self._kv_stored(qkv[:, k_end:])              # [N, kv_dim]
            self._k[li, write_slots] = k_rows
            self._v[li, write_slots] = v_rows
            keys, values = window.append(li, k_rows, v_rows)      # [KV, T, hd] each
            h = h + _attention(q, keys, values, mask) @ layer.o_t                               # [N, hidden]
            m = _rms_norm(h, layer.post_norm, spec.rms_norm_eps)
            gate_up = m @ layer.gate_up_t                         # [N, 2 * inter]
            gate, up = gate_up[:, :layer.inter], gate_up[:, layer.inter:]
            h = h + (_silu(gate) * up) @ layer.down_t             # [N, hidden]
            if hidden is not None:
                hidden.append(h)
        run.h = h


class _LayerRun:
    """What a forward carries from layer to layer: the residual rows and the tables every layer uses."""

    def __init__(self, backend: "NumpyBackend", x, positions, write_slots, window: "_KvWindow"):
        self.n = x.shape[0]
        self.cos, self.sin = backend._rope_tables(positions)        # [N, head_dim] each
        self.t0 = window.rows
        self.mask = _causal_tail_mask(self.n, self.t0 + self.n)     # [N, T] or None when N == 1
        self.h = np.array(x, dtype=np.float32)                       # [N, hidden] residual stream
        self.write_slots = write_slots
        self.window = window


class _KvWindow:
    """The K/V one forward (or one cycle) attends to, per layer, head-major [KV, T, hd]: the context's
    rows gathered from the arena once, then each call's new rows appended behind them."""

    def __init__(self, backend: "NumpyBackend", context_slots: np.ndarray, extra_rows: int):
        spec = backend.spec
        self._backend = backend
        self._context = context_slots
        self._gathered = [False] * spec.num_layers
        c = context_slots.size
        shape = (spec.num_layers, spec.num_kv_heads, c + int(extra_rows), spec.head_dim)
        self._k = np.empty(shape, np.float32)                    # [layers, KV, T_max, hd]
        self._v = np.empty(shape, np.float32)                    # [layers, KV, T_max, hd]
        self.rows = c                                            # rows filled in every layer

    def append(self, li: int, k_rows: np.ndarray, v_rows: np.ndarray) -> tuple:
        """Layer li's new rows [N, kv_dim] (as stored) behind the filled ones -> views [KV, rows + N, hd]."""
        b, spec = self._backend, self._backend.spec
        if not self._gathered[li]:                               # the context, once per layer (on first use)
            c = self._context.size
            self._k[li, :, :c] = b._k[li, self._context].reshape(c, spec.num_kv_heads, spec.head_dim).transpose(1, 0, 2)
            self._v[li, :, :c] = b._v[li, self._context].reshape(c, spec.num_kv_heads, spec.head_dim).transpose(1, 0, 2)
            self._gathered[li] = True
        t0, n = self.rows, k_rows.shape[0]
        self._k[li, :, t0:t0 + n] = k_rows.reshape(n, spec.num_kv_heads, spec.head_dim).transpose(1, 0, 2)
        self._v[li, :, t0:t0 + n] = v_rows.reshape(n, spec.num_kv_heads, spec.head_dim).transpose(1, 0, 2)
        return self._k[li, :, :t0 + n], self._v[li, :, :t0 + n]


def _weight_bytes(weights: ModelWeights) -> int:
    """Bytes of the weights: float tensors as the float32 arrays held here; INT4 tensors as a device holds them
    (4 bits per weight plus an fp16 scale per group: 4.125 bits at 128), not as the float32 copies of their
    dequantized values this backend computes with, so the figure is what the INT4 model needs on a GPU."""
    total = 0
    for name, arr in weights.named_tensors():      # a tied head is the embedding: counted once
        total += int4.device_bytes(arr.size, weights.int4_group_size) if name in weights.int4_names else arr.nbytes
    return total


class _FusedLayer:
    """One decoder layer's weights, transposed to [in, out] and fused so a step does 3 GEMMs + o_proj."""

    def __init__(self, layer):
        self.input_norm = layer.input_norm                                      # [hidden]
        self.post_norm = layer.post_norm                                        # [hidden]
        self.qkv_t = np.ascontiguousarray(np.concatenate([layer.q_proj, layer.k_proj, layer.v_proj]).T)  # [hidden, q+2kv]
        self.qkv_bias = (np.concatenate([layer.q_bias, layer.k_bias, layer.v_bias])                     # [q+2kv]
                         if layer.q_bias is not None else None)
        self.o_t = np.ascontiguousarray(layer.o_proj.T)                         # [q_dim, hidden]
        self.gate_up_t = np.ascontiguousarray(np.concatenate([layer.gate_proj, layer.up_proj]).T)       # [hidden, 2*inter]
        self.down_t = np.ascontiguousarray(layer.down_proj.T)                   # [inter, hidden]
        self.inter = layer.gate_proj.shape[0]


def _rms_norm(h: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    if h.shape[0] == 1:
        # A decode step's single row: the scale as one dot product and scalar arithmetic, two array operations
        # in all (on the CPU model each numpy call costs more than its arithmetic).
        row = h[0]
        inv = np.float32(1.0 / math.sqrt(float(row @ row) / row.size + eps))
        return weight * (h * inv)                                  # [1, hidden]
    # sum / n is what np.mean computes (same pairwise float32 sum, same division), without its Python wrapper.
    variance = np.square(h).sum(axis=-1, keepdims=True) / np.float32(h.shape[-1])   # [N, 1]
    return weight * (h / np.sqrt(variance + np.float32(eps)))      # [N, hidden]


def _apply_rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """Rotate-half RoPE: x * cos + rotate_half(x) * sin, rotate_half(x) = [-x2, x1]."""
    half = x.shape[-1] // 2
    cos, sin = cos[:, None, :], sin[:, None, :]                     # [N, 1, hd]
    out = x * cos                                                   # [N, heads, hd]
    out[..., :half] -= x[..., half:] * sin[..., :half]
    out[..., half:] += x[..., :half] * sin[..., half:]
    return out


def _silu(x: np.ndarray) -> np.ndarray:
    # sigmoid via tanh: no overflow warning for large negative inputs
    return x * (np.float32(0.5) * (np.float32(1.0) + np.tanh(np.float32(0.5) * x)))


def _causal_tail_mask(n: int, total: int) -> np.ndarray | None:
    """Additive mask [n, total]: the first total-n columns (context) are open to all rows; among the
    last n columns (this call's rows), row i sees columns up to its own."""
    if n == 1:
        return None
    mask = np.zeros((n, total), dtype=np.float32)                   # [N, T]
    mask[:, total - n:] = np.triu(np.full((n, n), -np.inf, dtype=np.float32), k=1)
    return mask


def _attention(q: np.ndarray, keys: np.ndarray, values: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
    """Grouped-query softmax attention. q [N, H, hd], keys/values [KV, T, hd] -> [N, H * hd]."""
    n, num_heads, hd = q.shape
    num_kv, total, _ = keys.shape
    group = num_heads // num_kv
    scale = np.float32(1.0 / np.sqrt(hd))
    if n == 1:
        # A decode step: the loop below for one row, without its mask, chunking and copies.
        scores = q.reshape(num_kv, group, hd) @ keys.transpose(0, 2, 1)     # [KV, G, T]
        scores *= scale
        scores -= scores.max(axis=-1, keepdims=True)
        np.exp(scores, out=scores)
        scores /= scores.sum(axis=-1, keepdims=True)
        return (scores @ values).reshape(1, num_heads * hd)               # [1, H * hd]
    # Query head h = kv * group + g reads KV head kv (HF repeat_kv order).
    qg = q.reshape(n, num_kv, group, hd).transpose(1, 2, 0, 3)      # [KV, G, N, hd]
    k_t = keys.transpose(0, 2, 1)                                   # [KV, hd, T]
    v = values                                                      # [KV, T, hd]
    out = np.empty((num_kv, group, n, hd), dtype=np.float32)        # [KV, G, N, hd]
    rows = max(1, ATTENTION_SCORE_ELEMENTS // max(1, num_heads * total))
    for r0 in range(0, n, rows):
        r1 = min(n, r0 + rows)
        b = r1 - r0
        scores = (qg[:, :, r0:r1].reshape(num_kv, group * b, hd) @ k_t).reshape(num_kv, group, b, total)  # [KV, G, b, T]
        scores *= scale
        if mask is not None:
            scores += mask[r0:r1]
        scores -= scores.max(axis=-1, keepdims=True)
        np.exp(scores, out=scores)
        scores /= scores.sum(axis=-1, keepdims=True)
        out[:, :, r0:r1] = (scores.reshape(num_kv, group * b, total) @ v).reshape(num_kv, group, b, hd)
    return out.transpose(2, 0, 1, 3).reshape(n, num_heads * hd)    # [N, H * hd]
