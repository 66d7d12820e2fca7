"""The PyCUDA transformer backend: hand-written kernels from cuda/, no cuBLAS, no torch.

Same contract as the numpy backend (model/backend.py): explicit absolute
positions, a KV arena of `capacity` slots allocated once, write_slots /
context_slots with holes allowed, causal within a call, K stored after RoPE.
Weights are uploaded once (bf16 bits or float32), activations and the KV
arena are float32. Every device buffer is allocated in the constructor, after
the planned total has been checked against the VRAM ceiling; nothing is
allocated per call or per token.

Two ways in:
  * `forward(...)`: the generic path, numpy in and out (verification, engine).
  * `run_cycle_tokens(...)`: one control cycle kept on the device: prefill,
    restricted argmax, then single-token decode steps that feed each chosen
    token back through an on-device embedding gather. Prefill and decode are
    captured as CUDA graphs (cuda_graphs.py) whose kernels read row offsets,
    lengths and slot lists from device memory, so one decode graph serves
    every step and one prefill graph every cycle of the same prefill length.

Two pipelines (DECODE_MAX_ROWS): bf16 calls of 1-2 rows run 6 kernels per layer
(projection_fused.cu: RMSNorm prologue, RoPE + K/V store and residual-add
epilogues; attention.cu), longer calls and fp32 one kernel per step
(projection_bf16.cu / projection_f32.cu, rope.cu, attention_tiled.cu).

Device layouts:
    k_cache, v_cache   [layers, kv_heads, capacity, head_dim] float32
    qkv weight         [q_dim + 2 kv_dim, hidden]  (q, k, v rows stacked; HF [out, in])
    qkv_rope weight    the same rows in kernel_reference.qkv_rope_row_order (bf16 decode pipeline)
    gate/up weight     [2 ceil8(inter), hidden]    interleaved in blocks of 8 (MODE_SWIGLU)
    tables             positions / write slots per cycle row, attend list = context + cycle rows
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import numpy as np

from ..core.action_codec import NonFiniteLogitsError
from . import cuda_kernels as ck
from .backend import ForwardResult
from .forward_inputs import check_forward_inputs, slot_array, token_id_array
from .kernel_reference import interleave_gate_up, permute_rows, qkv_rope_row_order, rope_inv_freq, to_bf16_bits
from .spec import ModelSpec
from .weights import ModelWeights, canonical_dtype, round_to_bf16

log = logging.getLogger(__name__)

GIB = 1024 ** 3
DEFAULT_MAX_ROWS = 128          # rows per kernel pass: a frame (32) + the longest suffix (48) fit in one
MAX_CYCLE_TOKENS = 256          # action tokens one cycle may emit
# Calls of at most this many rows take the decode pipeline: bf16 projections from
# projection_fused.cu (each block normalises its own row, RoPE + K/V store and residual adds in the
# epilogues: 6 launches per layer) and attention.cu. Longer calls (prefill) take one kernel per
# step with projection_bf16.cu and attention_tiled.cu. Chosen by measurement (notes/cuda_notes.md,
# run 5): the fused projections lose to the split ones on 32 rows, the tiled attention to the
# chunk kernel on one row.
DECODE_MAX_ROWS = 2
LAYER_GROUPS = ("projections", "attention", "norms+rope")


@dataclass(frozen=True)
class DecodeKernels:
    """Kernels of the decode pipeline (bf16 calls of <= DECODE_MAX_ROWS rows). Alternatives stay
    selectable so `vla-edge bench --backend pycuda --decode-variants` can time them side by side."""
    projection: str = "mma"      # "mma": projection_fused.cu (tensor cores, tiles of 16 rows)
    attention: str = "chunk"     # "chunk": attention.cu (K/V chunk in shared memory + merge)

    def __post_init__(self):
        if self.projection not in DECODE_PROJECTIONS:
            raise ValueError(f"DecodeKernels.projection must be one of {DECODE_PROJECTIONS}, got {self.projection!r}")
        if self.attention not in DECODE_ATTENTIONS:
            raise ValueError(f"DecodeKernels.attention must be one of {DECODE_ATTENTIONS}, got {self.attention!r}")

    @classmethod
    def parse(cls, text: str) -> "DecodeKernels":
        """'projection:attention', e.g. 'mma:chunk'."""
        parts = text.split(":")
        if len(parts) != 2:
            raise ValueError(f"decode variant {text!r}: expected 'projection:attention', e.g. 'mma:chunk'")
        return cls(*parts)

    def __str__(self) -> str:
        return f"{self.projection}:{self.attention}"


DECODE_PROJECTIONS = ("mma",)
DECODE_ATTENTIONS = ("chunk",)


class DeviceMemoryError(MemoryError):
    """The planned device allocation exceeds the configured VRAM ceiling."""


class NonFiniteActionError(NonFiniteLogitsError):
    """A restricted argmax on the device met NaN/Inf logits (reports the token index)."""


@dataclass
class _Layer:
    input_norm: object      # [hidden] f32
    post_norm: object       # [hidden] f32
    w_qkv: object           # [q+2kv, hidden] bf16 bits / f32
    w_qkv_rope: object      # [qkv_rope rows, hidden] bf16 bits in qkv_rope_row_order, decode only (None for f32)
    b_qkv: object           # [q+2kv] f32 or None
    w_o: object             # [hidden, q_dim]
    w_gate_up: object       # [2 ceil8(inter), hidden] interleaved
    w_down: object          # [hidden, inter]


class CudaBackend:
    """Backend protocol on one CUDA device (see the module docstring)."""

    def __init__(self, spec: ModelSpec, weights: ModelWeights, capacity: int, dtype: str = "bfloat16",
                 max_rows: int = DEFAULT_MAX_ROWS, vram_ceiling_bytes: int | None = 8 * GIB, use_graphs: bool = True,
                 decode_kernels: DecodeKernels = DecodeKernels()):
        self.spec = spec
        self.decode_kernels = decode_kernels
        self.capacity = int(capacity)
        self._slot_marks = np.zeros(self.capacity, dtype=bool)    # scratch for the slot-set checks of forward()
        self.dtype = canonical_dtype(dtype)
        self.max_rows = int(max_rows)
        self.use_graphs = use_graphs
        _check_model(spec, weights, self.capacity, self.max_rows)
        self._drv = ck.cuda_context()
        from pycuda import gpuarray
        self._gpuarray = gpuarray

        wdt = np.uint16 if self.dtype == "bfloat16" else np.float32
        plan = self._plan(wdt)
        self.planned_bytes = sum(int(np.prod(shape)) * np.dtype(dt).itemsize for shape, dt in plan.values())
        free, total = self._drv.mem_get_info()
        if vram_ceiling_bytes is not None and self.planned_bytes > vram_ceiling_bytes:
            raise DeviceMemoryError(
                f"CudaBackend: weights + KV arena ({self.capacity} slots) + scratch need {self.planned_bytes / GIB:.2f} GiB, "
                f"over the VRAM ceiling of {vram_ceiling_bytes / GIB:.2f} GiB (dtype {self.dtype}); lower kv capacity or use bf16")
        if self.planned_bytes > free:
            raise DeviceMemoryError(f"CudaBackend: need {self.planned_bytes / GIB:.2f} GiB, device has {free / GIB:.2f} GiB free")

        self.kernels = ck.CudaKernels()
        if self.kernels.sync_each_launch:
            self.use_graphs = False           # a synchronize inside a stream capture would invalidate it
        self.stream = self._drv.Stream()
        self._bytes = 0
        self._upload_weights(weights, wdt)
        self.weight_bytes = self._bytes - sum(l.w_qkv_rope.nbytes for l in self.layers if l.w_qkv_rope is not None)
        self._allocate_state()
        self.kv_bytes = self.k_cache.nbytes + self.v_cache.nbytes
        self._graphs: dict = {}
        self._cycle_events = tuple(self._drv.Event() for _ in range(3))
        self.last_cycle_device_ms: tuple | None = None     # (prefill, decode) of the latest run_cycle_tokens
        self.has_prefill_logits = False                     # a device prefill has run: prefill_logits() works
        self.stream.synchronize()
        log.info("CudaBackend %s: %.2f GiB on device (weights %.2f GiB, KV %.3f GiB), %d slots, %d rows per pass",
                 self.dtype, self._bytes / GIB, self.weight_bytes / GIB, self.kv_bytes / GIB, self.capacity, self.max_rows)

    # ------------------------------------------------------------------ Public API

    def embed(self, token_ids: np.ndarray) -> np.ndarray:
        ids = token_id_array(token_ids, self.spec.vocab_size)
        out = np.empty((ids.size, self.spec.hidden_size), np.float32)
        for start in range(0, ids.size, self.max_rows):
            n = min(self.max_rows, ids.size - start)
            self._put(self.ids, ids[start:start + n].astype(np.int32))
            self.kernels.embed_gather(self.embed_table, self.ids, self.resid, n, self.stream)
            out[start:start + n] = self._get(self.resid, n)
        return out

    def forward(self, x: np.ndarray, positions: np.ndarray, write_slots: np.ndarray,
                context_slots: np.ndarray, logits: str = "last", return_hidden: bool = False) -> ForwardResult:
        x, positions, write_slots, context_slots = self._check_inputs(x, positions, write_slots, context_slots, logits)
        n_total, c = x.shape[0], context_slots.size
        self._put(self.pos_table, positions.astype(np.int32))
        self._put(self.slot_table, write_slots.astype(np.int32))
        self._put(self.attend_list, np.concatenate([context_slots, write_slots]).astype(np.int32))
        hidden_chunks, logit_chunks = [], []
        for start in range(0, n_total, self.max_rows):
            n = min(self.max_rows, n_total - start)
            last_chunk = start + n == n_total
            self._put(self.resid, x[start:start + n])
            self._put(self.ctl, np.array([start, c, 0, 0], np.int32))
            layer_outs = []
            if return_hidden:
                layer_outs.append(self._get(self.resid, n))
            self._enqueue_layers(n, layer_outs if return_hidden else None)
            want_all = logits == "all"
            if return_hidden or want_all:
                self.kernels.rmsnorm(self.resid, self.final_norm, self.normed, n, self.spec.rms_norm_eps, self.stream)
            if return_hidden:
                layer_outs[-1] = self._get(self.normed, n)       # HF: last entry is after the final norm
                hidden_chunks.append(layer_outs)
            if want_all:
                self.kernels.projection(self.head, self.normed, self.logits, n, ck.MODE_STORE, self.stream)
                logit_chunks.append(self._get(self.logits, n))
            elif logits == "last" and last_chunk:
                if not return_hidden:
                    self.kernels.rmsnorm(self.resid, self.final_norm, self.normed, 1, self.spec.rms_norm_eps,
                                         self.stream, row0=n - 1)
                self.kernels.projection(self.head, self.normed, self.logits, 1, ck.MODE_STORE, self.stream, x_row0=n - 1)
                logit_chunks.append(self._get(self.logits, 1))
        hidden = [np.concatenate(parts) for parts in zip(*hidden_chunks)] if return_hidden else []
        out_logits = np.concatenate(logit_chunks) if logit_chunks else None
        return ForwardResult(logits=out_logits, hidden_states=hidden)

    def run_cycle_tokens(self, prefill_x: np.ndarray, positions: np.ndarray, write_slots: np.ndarray,
                         context_slots: np.ndarray, decode_slots: np.ndarray, decode_positions: np.ndarray,
                         action_bin_lo: int, n_tokens: int, n_bins: int | None = None) -> np.ndarray:
        """One cycle on the device: prefill rows -> token 0 (argmax over the action bins of the last row's
        logits) -> n_tokens-1 decode steps, step j feeding token j at decode_positions[j] into
        decode_slots[j]. Returns the n_tokens chosen token ids [n_tokens] int64."""
        self.begin_cycle(prefill_x, positions, write_slots, context_slots, decode_slots, decode_positions, n_tokens)
        bins = self._bins(action_bin_lo, n_bins)
        start, after_prefill, end = self._cycle_events
        start.record(self.stream)
        self.launch_prefill(prefill_x.shape[0], *bins)
        after_prefill.record(self.stream)
        for _ in range(n_tokens - 1):
            self.launch_decode_step(*bins)
        end.record(self.stream)
        tokens = self.finish_cycle(n_tokens)
        self.last_cycle_device_ms = (after_prefill.time_since(start), end.time_since(after_prefill))
        return tokens

    def prefill_logits(self) -> np.ndarray:
        """Full-vocabulary logits [vocab] of the last prefill row of the latest run_cycle_tokens (the
        cycle itself scores only the action bins). For checks and debugging, not for the cycle path."""
        if not self.has_prefill_logits:
            raise RuntimeError("prefill_logits: no device cycle has run yet")
        sp = self.spec
        self.kernels.rmsnorm(self.prefill_last, self.final_norm, self.normed, 1, sp.rms_norm_eps, self.stream)
        self.kernels.projection(self.head, self.normed, self.logits, 1, ck.MODE_STORE, self.stream)
        return self._get(self.logits, 1)[0]

    def begin_cycle(self, prefill_x, positions, write_slots, context_slots, decode_slots, decode_positions,
                    n_tokens: int) -> None:
        """Upload one cycle's rows, tables and control block (async on self.stream)."""
        n_dec = n_tokens - 1
        if not 1 <= n_tokens <= MAX_CYCLE_TOKENS:
            raise ValueError(f"n_tokens must be in [1, {MAX_CYCLE_TOKENS}], got {n_tokens}")
        decode_slots = np.asarray(decode_slots)
        decode_positions = np.asarray(decode_positions)
        if decode_slots.shape[0] < n_dec or decode_positions.shape[0] < n_dec:
            raise ValueError(f"decode_slots ({decode_slots.shape[0]}) and decode_positions ({decode_positions.shape[0]}) "
                             f"need {n_dec} entries for {n_tokens} tokens")
        decode_slots, decode_positions = decode_slots[:n_dec], decode_positions[:n_dec]
        all_slots = np.concatenate([np.asarray(write_slots), decode_slots])
        all_pos = np.concatenate([np.asarray(positions), decode_positions])
        x, all_pos, all_slots, context_slots = self._check_inputs(
            np.zeros((all_slots.size, self.spec.hidden_size), np.float32), all_pos, all_slots, context_slots, "last")
        prefill_x = np.asarray(prefill_x)
        p = prefill_x.shape[0] if prefill_x.ndim == 2 else -1
        if p < 1 or p + n_dec != all_slots.size or prefill_x.shape[1] != self.spec.hidden_size or prefill_x.dtype != np.float32:
            raise ValueError(f"prefill_x must be float32 [len(write_slots)={all_slots.size - n_dec}, {self.spec.hidden_size}], "
                             f"got {prefill_x.dtype} {prefill_x.shape}")
        if p > self.max_rows:
            raise ValueError(f"prefill of {p} rows exceeds max_rows {self.max_rows} of the device cycle path")
        self._put(self.resid, prefill_x)
        self._put(self.pos_table, all_pos.astype(np.int32))
        self._put(self.slot_table, all_slots.astype(np.int32))
        self._put(self.attend_list, np.concatenate([context_slots, all_slots]).astype(np.int32))
        self._put(self.ctl, np.array([0, context_slots.size, 0, -1], np.int32))

    def launch_prefill(self, n_rows: int, bin_lo: int, n_bins: int) -> None:
        """Enqueue (or replay) the prefill of n_rows rows ending with the restricted argmax."""
        self.has_prefill_logits = True
        self._run_graph(("prefill", n_rows, bin_lo, n_bins), lambda: self._enqueue_prefill(n_rows, bin_lo, n_bins))

    def launch_decode_step(self, bin_lo: int, n_bins: int) -> None:
        """Enqueue (or replay) one decode step: gather the last token, 1-row forward, restricted argmax."""
        self._run_graph(("decode", bin_lo, n_bins), lambda: self._enqueue_decode(bin_lo, n_bins))

    def finish_cycle(self, n_tokens: int) -> np.ndarray:
        tokens = self._get(self.tokens_out, n_tokens).astype(np.int64)
        bad = np.flatnonzero(tokens < 0)
        if bad.size:
            raise NonFiniteActionError(f"non-finite logits at action token {int(bad[0])} of {n_tokens} (device argmax)")
        return tokens

    def copy_slots(self, src_slots: np.ndarray, dst_slots: np.ndarray) -> None:
        src = self._slot_array(src_slots, "src_slots")
        dst = self._slot_array(dst_slots, "dst_slots")
        if src.shape != dst.shape:
            raise ValueError(f"copy_slots: src_slots {src.shape} and dst_slots {dst.shape} differ in length")
        if src.size > self.max_rows and np.intersect1d(src, dst).size:
            # Chunks would read slots an earlier chunk already overwrote: go through the host copy.
            self.write_kv(dst, self.read_kv(src))
            return
        for start in range(0, src.size, self.max_rows):
            n = min(self.max_rows, src.size - start)
            self._put(self.kv_slots_buf, src[start:start + n].astype(np.int32))
            self._kv_move("gather", n)
            self._put(self.kv_slots_buf, dst[start:start + n].astype(np.int32))
            self._kv_move("scatter", n)
        self.stream.synchronize()

    def read_kv(self, slots: np.ndarray) -> np.ndarray:
        """[2, layers, len(slots), kv_dim] float32: K (after RoPE) and V of the slots."""
        slots = self._slot_array(slots, "slots")
        out = np.empty((2, self.spec.num_layers, slots.size, self.spec.kv_dim), np.float32)
        for start in range(0, slots.size, self.max_rows):
            n = min(self.max_rows, slots.size - start)
            self._put(self.kv_slots_buf, slots[start:start + n].astype(np.int32))
            self._kv_move("gather", n)
            self.stream.synchronize()
            out[:, :, start:start + n] = self.kv_staging.get()[:, :, :n]
        return out

    def write_kv(self, slots: np.ndarray, kv: np.ndarray) -> None:
        slots = self._slot_array(slots, "slots")
        expected = (2, self.spec.num_layers, slots.size, self.spec.kv_dim)
        kv = np.asarray(kv)
        if kv.shape != expected or kv.dtype != np.float32:
            raise ValueError(f"write_kv: kv must be float32 {expected}, got {kv.dtype} {kv.shape}")
        staging = np.zeros(self.kv_staging.shape, np.float32)
        for start in range(0, slots.size, self.max_rows):
            n = min(self.max_rows, slots.size - start)
            staging[:, :, :n] = kv[:, :, start:start + n]
            self.stream.synchronize()
            self.kv_staging.set(staging)
            self._put(self.kv_slots_buf, slots[start:start + n].astype(np.int32))
            self._kv_move("scatter", n)
        self.stream.synchronize()

    # -- device-side KV staging (model/cuda_state_transfer.py moves KV between arenas without the host)

    def gather_kv_staging(self, slots: np.ndarray) -> None:
        """Enqueue on self.stream: K/V of up to max_rows slots into kv_staging ([2, layers, max_rows, kv_dim])."""
        slots = self._slot_array(slots, "slots")
        if slots.size > self.max_rows:
            raise ValueError(f"gather_kv_staging: {slots.size} slots exceed max_rows {self.max_rows}")
        self._put(self.kv_slots_buf, slots.astype(np.int32))
        self._kv_move("gather", slots.size)

    def scatter_kv_staging(self, slots: np.ndarray) -> None:
        """Enqueue on self.stream: the first len(slots) rows of kv_staging into these slots."""
        slots = self._slot_array(slots, "slots")
        if slots.size > self.max_rows:
            raise ValueError(f"scatter_kv_staging: {slots.size} slots exceed max_rows {self.max_rows}")
        self._put(self.kv_slots_buf, slots.astype(np.int32))
        self._kv_move("scatter", slots.size)

    def set_decode_kernels(self, choice: DecodeKernels) -> None:
        """Switch the decode pipeline's kernels (between cycles); captured graphs are rebuilt on next use."""
        if not isinstance(choice, DecodeKernels):
            raise TypeError(f"set_decode_kernels needs a DecodeKernels, got {type(choice).__name__}")
        self.stream.synchronize()
        for graph in self._graphs.values():
            graph.close()
        self._graphs.clear()
        self.decode_kernels = choice

    def layer_groups(self, n: int) -> tuple:
        """Kernel groups (LAYER_GROUPS) that a pass over n rows launches."""
        if self._fused(n):
            return ("projections", "attention")
        return LAYER_GROUPS

    def memory_bytes(self) -> int:
        """Device bytes held: weights + KV arena + scratch (all allocated in the constructor)."""
        return int(self._bytes)

    def decode_stream_bytes(self, n_bins: int) -> int:
        """Bytes one restricted decode step must read at least: layer weights + the n_bins head rows."""
        row = self.spec.hidden_size * (2 if self.dtype == "bfloat16" else 4)
        return int(self.layer_weight_bytes + n_bins * row)

    def close(self) -> None:
        for graph in self._graphs.values():
            graph.close()
        self._graphs.clear()

    # ------------------------------------------------------------------ Internal helpers

    def _bins(self, action_bin_lo: int, n_bins: int | None) -> tuple[int, int]:
        n_bins = self.spec.vocab_size - action_bin_lo if n_bins is None else n_bins
        if not (0 <= action_bin_lo and n_bins > 0 and action_bin_lo + n_bins <= self.spec.vocab_size):
            raise ValueError(f"action bins [{action_bin_lo}, {action_bin_lo + n_bins}) outside the vocabulary of "
                             f"{self.spec.vocab_size}")
        return int(action_bin_lo), int(n_bins)

    def _plan(self, wdt) -> dict:
        """name -> (shape, dtype) of every device buffer, for the ceiling check before allocating."""
        sp, m = self.spec, self.max_rows
        qkv_rows = sp.q_dim + 2 * sp.kv_dim
        i8 = -(-sp.intermediate_size // 8) * 8
        plan = {"embed": ((sp.vocab_size, sp.hidden_size), wdt), "final_norm": ((sp.hidden_size,), np.float32),
                "inv_freq": ((sp.head_dim // 2,), np.float32)}
        if not sp.tie_word_embeddings:
            plan["lm_head"] = ((sp.vocab_size, sp.hidden_size), wdt)
        for i in range(sp.num_layers):
            plan[f"layer{i}.norms"] = ((2 * sp.hidden_size,), np.float32)
            plan[f"layer{i}.qkv"] = ((qkv_rows, sp.hidden_size), wdt)
            if wdt == np.uint16:
                plan[f"layer{i}.qkv_rope"] = ((len(self._rope_order()), sp.hidden_size), wdt)
            if sp.qkv_bias:
                plan[f"layer{i}.qkv_bias"] = ((qkv_rows,), np.float32)
            plan[f"layer{i}.o"] = ((sp.hidden_size, sp.q_dim), wdt)
            plan[f"layer{i}.gate_up"] = ((2 * i8, sp.hidden_size), wdt)
            plan[f"layer{i}.down"] = ((sp.hidden_size, sp.intermediate_size), wdt)
        kv = (sp.num_layers, sp.num_kv_heads, self.capacity, sp.head_dim)
        self.n_splits = -(-self.capacity // ck.ATTN_CHUNK)
        plan.update({
            "k_cache": (kv, np.float32), "v_cache": (kv, np.float32),
            "resid": ((m, sp.hidden_size), np.float32), "normed": ((m, sp.hidden_size), np.float32),
            "prefill_last": ((1, sp.hidden_size), np.float32),
            "qkv": ((m, qkv_rows), np.float32), "attn": ((m, sp.q_dim), np.float32),
            "act": ((m, sp.intermediate_size), np.float32),
            "part_o": ((m, sp.num_heads, self.n_splits, sp.head_dim), np.float32),
            "part_ml": ((m, sp.num_heads, self.n_splits, 2), np.float32),
            "logits": ((m, sp.vocab_size), np.float32),
            "tables": ((3 * self.capacity + m + ck.CTL_INTS + MAX_CYCLE_TOKENS,), np.int32),
            "kv_staging": ((2, sp.num_layers, m, sp.kv_dim), np.float32), "kv_slots": ((m,), np.int32),
        })
        return plan

    def _rope_order(self) -> np.ndarray:
        sp = self.spec
        return qkv_rope_row_order(sp.num_heads, sp.num_kv_heads, sp.head_dim)

    def _alloc(self, shape, dtype, zero: bool = True):
        arr = self._gpuarray.zeros(shape, dtype) if zero else self._gpuarray.empty(shape, dtype)
        self._bytes += arr.nbytes
        return arr

    def _to_device(self, host: np.ndarray, wdt=np.float32):
        if wdt == np.uint16:
            host = to_bf16_bits(host)
        elif self.dtype == "bfloat16":
            # Norm weights and biases of a bf16 model are bf16 values too (kept as float32 on the device).
            host = round_to_bf16(np.asarray(host, np.float32))
        host = np.ascontiguousarray(host, dtype=host.dtype if wdt == np.uint16 else np.float32)
        arr = self._gpuarray.to_gpu(host)
        self._bytes += arr.nbytes
        return arr

    def _upload_weights(self, w: ModelWeights, wdt) -> None:
        sp = self.spec
        self.embed_table = self._to_device(w.embed, wdt)                              # [vocab, hidden]
        self.head = self.embed_table if w.tied else self._to_device(w.lm_head, wdt)   # [vocab, hidden]
        self.final_norm = self._to_device(w.final_norm)                               # [hidden]
        self.inv_freq = self._gpuarray.to_gpu(rope_inv_freq(sp.rope_theta, sp.head_dim))   # [hd/2], never rounded
        self._bytes += self.inv_freq.nbytes
        before = self._bytes
        self.layers = []
        for lw in w.layers:
            b_qkv = None
            if lw.q_bias is not None:
                b_qkv = self._to_device(np.concatenate([lw.q_bias, lw.k_bias, lw.v_bias]))
            w_qkv = np.concatenate([lw.q_proj, lw.k_proj, lw.v_proj])                # [q+2kv, hidden]
            self.layers.append(_Layer(
                input_norm=self._to_device(lw.input_norm),
                post_norm=self._to_device(lw.post_norm),
                w_qkv=self._to_device(w_qkv, wdt),
                w_qkv_rope=self._to_device(permute_rows(w_qkv, self._rope_order()), wdt) if wdt == np.uint16 else None,
                b_qkv=b_qkv,
                w_o=self._to_device(lw.o_proj, wdt),
                w_gate_up=self._to_device(interleave_gate_up(lw.gate_proj, lw.up_proj), wdt),
                w_down=self._to_device(lw.down_proj, wdt)))
        # A pass streams one of the two q|k|v layouts: count one.
        duplicate = sum(layer.w_qkv_rope.nbytes for layer in self.layers if layer.w_qkv_rope is not None)
        self.layer_weight_bytes = self._bytes - before - duplicate

    def _allocate_state(self) -> None:
        sp, m, cap = self.spec, self.max_rows, self.capacity
        kv = (sp.num_layers, sp.num_kv_heads, cap, sp.head_dim)
        self.k_cache = self._alloc(kv, np.float32)
        self.v_cache = self._alloc(kv, np.float32)
        self._layer_stride = sp.num_kv_heads * cap * sp.head_dim * 4                  # bytes per layer
        self.resid = self._alloc((m, sp.hidden_size), np.float32)                     # residual stream
        self.normed = self._alloc((m, sp.hidden_size), np.float32)                    # norm outputs
        self.prefill_last = self._alloc((1, sp.hidden_size), np.float32)              # last prefill row, final layer
        self.qkv = self._alloc((m, sp.q_dim + 2 * sp.kv_dim), np.float32)
        self.attn = self._alloc((m, sp.q_dim), np.float32)
        self.act = self._alloc((m, sp.intermediate_size), np.float32)                 # silu(gate) * up
        self.part_o = self._alloc((m, sp.num_heads, self.n_splits, sp.head_dim), np.float32)
        self.part_ml = self._alloc((m, sp.num_heads, self.n_splits, 2), np.float32)
        self.logits = self._alloc((m, sp.vocab_size), np.float32)
        self.pos_table = self._alloc((cap,), np.int32)
        self.slot_table = self._alloc((cap,), np.int32)
        self.attend_list = self._alloc((cap,), np.int32)
        self.ids = self._alloc((m,), np.int32)
        self.ctl = self._alloc((ck.CTL_INTS,), np.int32)
        self.tokens_out = self._alloc((MAX_CYCLE_TOKENS,), np.int32)
        self.kv_staging = self._alloc((2, sp.num_layers, m, sp.kv_dim), np.float32)
        self.kv_slots_buf = self._alloc((m,), np.int32)
        self._token_ids = self.ctl[ck.CTL_TOKEN:ck.CTL_TOKEN + 1]                     # decode input id (view)
        self._scale = float(sp.head_dim ** -0.5)

    def _kv_ptrs(self, layer: int) -> tuple[int, int]:
        off = layer * self._layer_stride
        return int(self.k_cache.gpudata) + off, int(self.v_cache.gpudata) + off

    def _fused(self, n: int) -> bool:
        return self.dtype == "bfloat16" and n <= DECODE_MAX_ROWS

    def _enqueue_layers(self, n: int, layer_outs: list | None = None, groups=LAYER_GROUPS) -> None:
        """All decoder layers over rows [0, n) of resid; row offsets and lengths come from ctl.
        `groups` limits the launches to some of LAYER_GROUPS (the benchmark times them apart)."""
        for li, layer in enumerate(self.layers):
            if self._fused(n):
                self._enqueue_layer_fused(li, layer, n, groups)
            else:
                self._enqueue_layer_split(li, layer, n, groups)
            if layer_outs is not None:
                layer_outs.append(self._get(self.resid, n))

    def _enqueue_layer_fused(self, li: int, layer: _Layer, n: int, groups) -> None:
        """bf16 decode: RMSNorm folded into the q|k|v and gate/up projections, RoPE and the K/V store
        in the q|k|v epilogue, residual adds in the o/down epilogues."""
        sp, s, proj = self.spec, self.stream, self._decode_projection
        if "projections" in groups:
            proj(layer.w_qkv_rope, self.resid, self.qkv, n, ck.MODE_QKV_ROPE, s, norm_w=layer.input_norm,
                 eps=sp.rms_norm_eps, bias=layer.b_qkv, rope=self._rope_target(li))
        if "attention" in groups:
            self._enqueue_attention(li, n)
        if "projections" in groups:
            proj(layer.w_o, self.attn, self.resid, n, ck.MODE_ADD, s)
            proj(layer.w_gate_up, self.resid, self.act, n, ck.MODE_SWIGLU, s, norm_w=layer.post_norm,
                 eps=sp.rms_norm_eps, out_cols=sp.intermediate_size)
            proj(layer.w_down, self.act, self.resid, n, ck.MODE_ADD, s)

    def _enqueue_layer_split(self, li: int, layer: _Layer, n: int, groups) -> None:
        """One kernel per step: RMSNorm (+ bias init), q|k|v, RoPE + K/V store, attention, o, RMSNorm,
        gate/up + SwiGLU, down (prefill, and every call of the fp32 path)."""
        sp, kn, s = self.spec, self.kernels, self.stream
        k_ptr, v_ptr = self._kv_ptrs(li)
        proj, other = "projections" in groups, "norms+rope" in groups
        if other:
            kn.rmsnorm(self.resid, layer.input_norm, self.normed, n, sp.rms_norm_eps, s, init_dst=self.qkv,
                       init_src=layer.b_qkv)
        if proj:
            kn.projection(layer.w_qkv, self.normed, self.qkv, n, ck.MODE_ADD, s)
        if other:
            kn.rope_store(self.qkv, self.pos_table, self.slot_table, self.ctl, self.inv_freq, k_ptr, v_ptr, n,
                          sp.num_heads, sp.num_kv_heads, sp.head_dim, self.capacity, s)
        if "attention" in groups:
            self._enqueue_attention(li, n)
        if proj:
            kn.projection(layer.w_o, self.attn, self.resid, n, ck.MODE_ADD, s)
        if other:
            kn.rmsnorm(self.resid, layer.post_norm, self.normed, n, sp.rms_norm_eps, s)
        if proj:
            kn.projection(layer.w_gate_up, self.normed, self.act, n, ck.MODE_SWIGLU, s, out_cols=sp.intermediate_size)
            kn.projection(layer.w_down, self.act, self.resid, n, ck.MODE_ADD, s)

    def _decode_projection(self, W, x, out, n: int, mode: int, stream, **kw) -> None:
        """A projection of the decode pipeline with the kernel self.decode_kernels names (same contract)."""
        self.kernels.projection_fused(W, x, out, n, mode, stream, **kw)

    def _enqueue_attention(self, li: int, n: int) -> None:
        """attention.cu for decode rows, attention_tiled.cu (K/V chunk shared by up to 8 rows) for longer calls."""
        sp = self.spec
        k_ptr, v_ptr = self._kv_ptrs(li)
        self.kernels.attention(self.qkv, k_ptr, v_ptr, self.attend_list, self.ctl, self.part_o, self.part_ml, self.attn,
                               n, sp.num_heads, sp.num_kv_heads, sp.head_dim, self.capacity, self.n_splits,
                               self._scale, self.stream, tiled=n > DECODE_MAX_ROWS)

    def _rope_target(self, li: int) -> ck.RopeTarget:
        sp = self.spec
        k_ptr, v_ptr = self._kv_ptrs(li)
        return ck.RopeTarget(self.pos_table, self.slot_table, self.ctl, self.inv_freq, k_ptr, v_ptr,
                             sp.num_heads, sp.num_kv_heads, sp.head_dim, self.capacity)

    def _enqueue_head_argmax(self, row: int, bin_lo: int, n_bins: int, rows_consumed: int) -> None:
        sp, kn, s = self.spec, self.kernels, self.stream
        if self._fused(1):                      # final RMSNorm folded into the head projection
            self._decode_projection(self.head, self.resid, self.logits, 1, ck.MODE_STORE, s, norm_w=self.final_norm,
                                    eps=sp.rms_norm_eps, w_row0=bin_lo, rows=n_bins, x_row0=row)
        else:
            kn.rmsnorm(self.resid, self.final_norm, self.normed, 1, sp.rms_norm_eps, s, row0=row)
            kn.projection(self.head, self.normed, self.logits, 1, ck.MODE_STORE, s, w_row0=bin_lo, rows=n_bins, x_row0=row)
        kn.argmax_bins(self.logits, n_bins, bin_lo, self.ctl, self.tokens_out, rows_consumed, s)

    def _enqueue_prefill(self, n_rows: int, bin_lo: int, n_bins: int) -> None:
        self._enqueue_layers(n_rows)
        # Keep the last row's final hidden state: decode reuses resid, prefill_logits() reads this.
        row_bytes = self.spec.hidden_size * 4
        self._drv.memcpy_dtod_async(int(self.prefill_last.gpudata), int(self.resid.gpudata) + (n_rows - 1) * row_bytes,
                                    row_bytes, self.stream)
        self._enqueue_head_argmax(n_rows - 1, bin_lo, n_bins, n_rows)

    def _enqueue_decode(self, bin_lo: int, n_bins: int) -> None:
        self.kernels.embed_gather(self.embed_table, self._token_ids, self.resid, 1, self.stream)
        self._enqueue_layers(1)
        self._enqueue_head_argmax(0, bin_lo, n_bins, 1)

    def _run_graph(self, key, record) -> None:
        if not self.use_graphs:
            record()
            return
        graph = self._graphs.get(key)
        if graph is None:
            from .cuda_graphs import capture
            graph = capture("-".join(map(str, key)), self.stream, record)
            self._graphs[key] = graph
        graph.launch(self.stream)

    def _kv_move(self, direction: str, n: int) -> None:
        sp = self.spec
        self.kernels.kv_move(direction, self.k_cache, self.v_cache, self.kv_slots_buf, self.kv_staging, n,
                             sp.num_layers, sp.num_kv_heads, self.capacity, sp.head_dim, self.stream)

    def _put(self, dst, host: np.ndarray) -> None:
        """Copy a host array into the start of a device buffer, ordered on self.stream."""
        host = np.ascontiguousarray(host, dtype=dst.dtype)
        if host.size > dst.size:
            raise ValueError(f"{host.size} values do not fit a device buffer of {dst.size}")
        if host.size:
            self._drv.memcpy_htod_async(int(dst.gpudata), host, self.stream)

    def _get(self, src, n_rows: int) -> np.ndarray:
        """Synchronize and copy the first n_rows of a device buffer to the host."""
        self.stream.synchronize()
        return src[:n_rows].get()

    def _check_inputs(self, x, positions, write_slots, context_slots, logits):
        return check_forward_inputs(self.spec.hidden_size, self._slot_marks, x, positions, write_slots,
                                    context_slots, logits)

    def _slot_array(self, slots, name: str) -> np.ndarray:
        return slot_array(slots, name, self.capacity)


def _check_model(spec: ModelSpec, weights: ModelWeights, capacity: int, max_rows: int) -> None:
    """Shapes the kernels need, with errors naming the offending dimension."""
    if capacity <= 0:
        raise ValueError(f"capacity must be > 0 KV slots, got {capacity}")
    if max_rows <= 0:
        raise ValueError(f"max_rows must be > 0, got {max_rows}")
    if len(weights.layers) != spec.num_layers:
        raise ValueError(f"weights have {len(weights.layers)} layers, spec says {spec.num_layers}")
    for name in ("hidden_size", "intermediate_size", "q_dim"):
        value = getattr(spec, name)
        if value % 32:
            raise ValueError(f"CudaBackend needs {name} % 32 == 0 (projection K steps of 32), got {value}")
    group = spec.num_heads // spec.num_kv_heads
    if group > ck.ATTN_MAX_GROUP or spec.head_dim > ck.ATTN_MAX_HEAD_DIM or spec.head_dim % 2:
        raise ValueError(f"CudaBackend attention supports head groups <= {ck.ATTN_MAX_GROUP} and even head_dim <= "
                         f"{ck.ATTN_MAX_HEAD_DIM}; got group {group}, head_dim {spec.head_dim}")
    if not math.isfinite(spec.rope_theta) or spec.rope_theta <= 0:
        raise ValueError(f"rope_theta must be a positive number, got {spec.rope_theta}")
