"""The PyCUDA transformer backend: hand-written kernels from cuda/, no cuBLAS, no torch.

Same contract as the numpy backend (model/backend.py): explicit absolute
positions, a KV arena of `capacity` slots allocated once, write_slots /
context_slots with holes allowed, causal within a call, K stored after RoPE.
Weights are uploaded once (bf16 bits or float32; an INT4 snapshot's projections as
packed nibbles + fp16 scales, model/int4.py, the rest in the backend's dtype), activations are float32,
the KV arena float32 or (kv_dtype bfloat16) bf16 bits, widened to float32 as
the attention loads them (cuda/kv_store.cuh). Every device buffer is
allocated in the constructor, after
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

Two pipelines (DECODE_MAX_ROWS): bf16 and INT4 one-row calls run 6 kernels per layer
(gemv.cu / gemv_int4.cu: RMSNorm prologue, RoPE + K/V store, SwiGLU and residual-add
epilogues; attention_decode.cu + the merge of attention.cu), longer calls and fp32
one kernel per step (INT4 projections: projection_int4.cu) (projection_staged.cu / projection_bf16.cu / projection_f32.cu,
rope.cu, attention_mma.cu on the tensor cores for bf16 / attention_tiled.cu for fp32;
fp32 decode rows also take attention_decode.cu). Where a step has more than one
kernel, a KernelPlan (cuda_kernel_plan.py) names the one launched; a backend is
built with the measured-best plan, and the lab (bench/kernel_lab.py) switches
it to others between cycles (use_kernel_plan) to time or compare them.

Device layouts:
    k_cache, v_cache   [layers, kv_heads, capacity, head_dim] float32, or uint16 bf16 bits (kv_dtype)
    qkv weight         [q_dim + 2 kv_dim, hidden]  (q, k, v rows stacked; HF [out, in])
    qkv_rope weight    the same rows in weight_layouts.qkv_rope_row_order (bf16 decode pipeline)
    gate/up weight     [2 ceil8(inter), hidden]    interleaved in blocks of 8 (MODE_SWIGLU)
    tables             positions / write slots per cycle row, attend list = context + cycle rows
"""
from __future__ import annotations

import dataclasses
import logging
import math
import time

import numpy as np

from . import cuda_attention_launchers as ca
from . import cuda_kernels as ck
from .backend import ForwardResult
from .errors import NonFiniteLogitsError
from .forward_inputs import check_forward_inputs, slot_array, token_id_array
from .cuda_device import primary_device
from .cuda_gil_held import SHORT_COPY_BYTES, copy_dtoh, copy_htod_async
from .cuda_int4_launchers import lean_int4_group
from .cuda_launch_common import ATTN_MAX_GROUP
from .spec import ModelSpec
from .weight_stream import tensor_source
from .cuda_bulk_launchers import BULK_GEMMS, FLASH_BKV, FLASH_HEAD_DIMS, FLASH_WIDE_MAX_GROUP
from .cuda_device_memory import MAX_CYCLE_TOKENS, DeviceMemory
from .cuda_kv_transfer import KvTransfer, on_device
from .cuda_kernel_plan import MEASURED_BEST, KernelPlan
from .cuda_layer_enqueue import LayerEnqueue
from .layered_forward import LayeredForward, OneLayeredForward, layer_pieces
from .weights import canonical_dtype

log = logging.getLogger(__name__)

GIB = 1024 ** 3
DEFAULT_MAX_ROWS = 128          # rows per kernel pass: a frame (32) + the longest suffix (48) fit in one
# The bulk prefill (model.bulk_prefill_min_rows > 0; gemm_wgmma.cu or gemm_bulk.cu, prefill_bulk.cu): the rows from
# which a forward takes it and the rows per pass, by default (its kernel choices: KernelPlan; the attention's partial
# sums: cuda_device_memory.BULK_PARTIAL_ROWS).
DEFAULT_BULK_MIN_ROWS = 64      # even with the cycle's kernels there on the H200 (5.5 vs 5.3 ms), ahead from 128
DEFAULT_BULK_MAX_ROWS = 1024
DEFAULT_BULK_PRECISION = "split"
# model.bulk_prefill_precision -> KernelPlan.bulk_activation_parts (config.BULK_PRECISIONS).
BULK_PRECISION_PARTS = {"split": 2, "bf16": 1}


class DeviceMemoryError(MemoryError):
    """The planned device allocation exceeds the configured VRAM ceiling."""


class NonFiniteActionError(NonFiniteLogitsError):
    """A restricted argmax on the device met NaN/Inf logits (reports the token index)."""


class CudaBackend(DeviceMemory, LayerEnqueue, KvTransfer, OneLayeredForward):
    """Backend protocol on one CUDA device (see the module docstring).

    Constructor: weights: a snapshot directory (streamed to the device tensor by tensor), a ModelWeights, or a
    weight_stream source; device: a cuda_device.CudaDevice (default: device 0's primary context);
    plan: the kernel of each step that has a choice (cuda_kernel_plan.KernelPlan; default the measured-best,
    which serving never changes; the plan in effect, after the fallbacks this device and model need, is
    `kernel_plan`, and use_kernel_plan switches it between cycles); kv_dtype: the KV arena's
    element, float32 or bfloat16 (K and V rounded to nearest even as they are stored: half the arena,
    attention bytes and swap bytes); bulk_prefill_min_rows: a forward() over at least this many rows runs
    the bulk prefill (gemm_bulk.cu, prefill_bulk.cu: tensor-core GEMMs and flash attention, passes of
    bulk_prefill_max_rows rows; bf16 models), 0: never; bulk_prefill_precision: its products' operands, "split"
    (bf16 hi + lo pairs) or "bf16" (one bf16 operand, as HF: the plan's bulk_activation_parts 1). An INT4
    snapshot (weights: its directory) computes every forward from its INT4 projections (w_hat = q * scale, as
    the numpy backend); its long forwards take the cycle's kernels in passes of max_rows (_bulk_rows says why)."""

    def __init__(self, spec: ModelSpec, weights, capacity: int, dtype: str = "bfloat16",
                 max_rows: int = DEFAULT_MAX_ROWS, vram_ceiling_bytes: int | None = 8 * GIB, use_graphs: bool = True,
                 plan: KernelPlan = MEASURED_BEST, device=None, kv_dtype: str = "float32",
                 bulk_prefill_min_rows: int = DEFAULT_BULK_MIN_ROWS, bulk_prefill_max_rows: int = DEFAULT_BULK_MAX_ROWS,
                 bulk_prefill_precision: str = DEFAULT_BULK_PRECISION):
        _check_plan_type(plan)
        plan = _with_bulk_precision(plan, bulk_prefill_precision)
        self.spec = spec
        self.kernel_plan: KernelPlan | None = None        # use_kernel_plan() sets it once the kernels are built
        self.capacity = int(capacity)
        self._slot_marks = np.zeros(self.capacity, dtype=bool)    # scratch for the slot-set checks of forward()
        self.dtype = canonical_dtype(dtype)
        if kv_dtype not in ck.KV_ARENA_TYPES:
            raise ValueError(f"kv_dtype must be one of {tuple(ck.KV_ARENA_TYPES)}, got {kv_dtype!r}")
        self.kv_dtype = kv_dtype
        self.kv_element = np.dtype(ck.KV_ARENA_TYPES[kv_dtype][0])    # uint16 (bf16 bits) or float32 on the device
        self.max_rows = int(max_rows)
        self.use_graphs = use_graphs
        _check_model(spec, self.capacity, self.max_rows)
        source = tensor_source(weights, spec)
        self.int4 = bool(source.int4)
        self.int4_group = int(source.int4_group_size) if self.int4 else 0
        _check_int4_group(self.int4_group)
        self.bulk_min_rows, self.bulk_max_rows = _bulk_rows(spec, self.dtype, int(bulk_prefill_min_rows),
                                                            int(bulk_prefill_max_rows), self.int4)
        self.device = device if device is not None else primary_device(0)
        self._drv = self.device.drv
        from pycuda import gpuarray
        self._gpuarray = gpuarray
        self._buffers: list = []          # every device allocation, freed by close()
        self._graphs: dict = {}
        self._landing = None
        self.closed = False

        wdt = np.uint16 if self.dtype == "bfloat16" else np.float32
        buffers = self._plan(wdt)
        self.planned_bytes = sum(int(np.prod(shape)) * np.dtype(dt).itemsize for shape, dt in buffers.values())
        with self.device.bound():
            self._check_plan_fits(vram_ceiling_bytes)
            try:
                self._build(source, wdt)
            except BaseException:
                self._free_buffers()      # a failed build (bad tensor, compile error) leaves nothing allocated
                raise
        log.info("CudaBackend %s%s on %s: %.2f GiB on device (weights %.2f GiB, KV %.3f GiB in %s), %d slots, %d rows "
                 "per pass", self.dtype, f" + INT4 projections (groups of {self.int4_group})" if self.int4 else "",
                 self.device.describe(), self._bytes / GIB, self.weight_bytes / GIB,
                 self.kv_bytes / GIB, self.kv_dtype, self.capacity, self.max_rows)
        try:
            self.use_kernel_plan(plan)
        except BaseException:
            self.close()
            raise

    def _check_plan_fits(self, vram_ceiling_bytes: int | None) -> None:
        """DeviceMemoryError unless the planned bytes fit the ceiling and the device's free memory (context current)."""
        free, _total = self._drv.mem_get_info()
        if vram_ceiling_bytes is not None and self.planned_bytes > vram_ceiling_bytes:
            raise DeviceMemoryError(
                f"CudaBackend: weights + KV arena ({self.capacity} slots) + scratch need {self.planned_bytes / GIB:.2f} "
                f"GiB, over the VRAM ceiling of {vram_ceiling_bytes / GIB:.2f} GiB (dtype {self.dtype}); lower kv "
                f"capacity or use bf16")
        if self.planned_bytes > free:
            raise DeviceMemoryError(f"CudaBackend: need {self.planned_bytes / GIB:.2f} GiB, device has "
                                    f"{free / GIB:.2f} GiB free")

    def _build(self, source, wdt) -> None:
        """Compile/load the kernels, upload the weights and allocate the state (device context current)."""
        self.kernels = ck.CudaKernels(self.device, kv_dtype=self.kv_dtype)
        if self.kernels.sync_each_launch:
            self.use_graphs = False           # a synchronize inside a stream capture would invalidate it
        self.stream = self._drv.Stream()
        if self.bulk_min_rows:
            self.kernels.load_family("prefill_bulk")         # the GEMM family: use_kernel_plan, as the plan names it
        if self.int4:
            self.kernels.load_family("gemv_int4")            # on demand elsewhere: before any graph capture here
            self.kernels.load_family("projection_int4")
        self._bytes = 0
        self._upload_weights(source, wdt)
        self.weight_bytes = self._bytes - sum(l.w_qkv_rope.nbytes for l in self.layers if l.w_qkv_rope is not None)
        self._allocate_state()
        self.kv_bytes = self.k_cache.nbytes + self.v_cache.nbytes
        self._cycle_events = tuple(self._drv.Event() for _ in range(3))
        self.last_cycle_ms: tuple | None = None     # (prefill, decode) of the latest run_cycle_tokens
        self.has_prefill_logits = False                     # a device prefill has run: prefill_logits() works
        self.stream.synchronize()

    # ------------------------------------------------------------------ Public API

    @on_device
    def embed(self, token_ids: np.ndarray) -> np.ndarray:
        self._require_no_layered("embed")                  # it gathers through the residual rows
        ids = token_id_array(token_ids, self.spec.vocab_size)
        out = np.empty((ids.size, self.spec.hidden_size), np.float32)
        for start in range(0, ids.size, self.max_rows):
            n = min(self.max_rows, ids.size - start)
            self._put(self.ids, ids[start:start + n].astype(np.int32))
            self.kernels.embed_gather(self.embed_table, self.ids, self.resid, n, self.stream)
            out[start:start + n] = self._get(self.resid, n)
        return out

    @on_device
    def forward(self, x: np.ndarray, positions: np.ndarray, write_slots: np.ndarray,
                context_slots: np.ndarray, logits: str = "last", return_hidden: bool = False) -> ForwardResult:
        self._require_no_layered("forward")
        x, positions, write_slots, context_slots = self._check_inputs(x, positions, write_slots, context_slots, logits)
        n_total, c = x.shape[0], context_slots.size
        self._put_forward_tables(positions, write_slots, context_slots)
        hidden_chunks, logit_chunks = [], []
        for start, n, bulk in self._passes(n_total):
            last_chunk = start + n == n_total
            self._put_pass(x[start:start + n], start, c)
            enqueue = self._enqueue_bulk_layers if bulk else self._enqueue_layers
            layer_outs = []
            if return_hidden:
                layer_outs.append(self._get(self.resid, n))
                enqueue(n, layer_outs)
            else:
                # The layers as a graph per row count (the kernels read offsets, lengths and slots from the device
                # tables written above): one launch instead of ~9 per layer, which had made a reconciler's
                # one-frame step host-bound (~12 ms on the H200 for ~3 ms of device work).
                self._run_graph(("bulk" if bulk else "layers", n), lambda: enqueue(n))
            want_all = logits == "all"
            if return_hidden or want_all:
                self.kernels.rmsnorm(self.resid, self.final_norm, self.normed, n, self.spec.rms_norm_eps, self.stream)
            if return_hidden:
                layer_outs[-1] = self._get(self.normed, n)       # HF: last entry is after the final norm
                hidden_chunks.append(layer_outs)
            if want_all:
                for r0 in range(0, n, self.max_rows):            # the logits buffer holds max_rows rows
                    k = min(self.max_rows, n - r0)
                    self.kernels.projection(self.head, self.normed, self.logits, k, ck.MODE_STORE, self.stream,
                                            x_row0=r0)
                    logit_chunks.append(self._get(self.logits, k))
            elif logits == "last" and last_chunk:
                if not return_hidden:
                    self.kernels.rmsnorm(self.resid, self.final_norm, self.normed, 1, self.spec.rms_norm_eps,
                                         self.stream, row0=n - 1)
                self.kernels.projection(self.head, self.normed, self.logits, 1, ck.MODE_STORE, self.stream, x_row0=n - 1)
                logit_chunks.append(self._get(self.logits, 1))
        hidden = [np.concatenate(parts) for parts in zip(*hidden_chunks)] if return_hidden else []
        out_logits = np.concatenate(logit_chunks) if logit_chunks else None
        return ForwardResult(logits=out_logits, hidden_states=hidden)

    @on_device
    def run_cycle_tokens(self, prefill_x: np.ndarray, positions: np.ndarray, write_slots: np.ndarray,
                         context_slots: np.ndarray, decode_slots: np.ndarray, decode_positions: np.ndarray,
                         action_bin_lo: int, n_tokens: int, n_bins: int | None = None, give_up=None) -> np.ndarray:
        """One cycle on the device: prefill rows -> token 0 (argmax over the action bins of the last row's
        logits) -> n_tokens-1 decode steps, step j feeding token j at decode_positions[j] into
        decode_slots[j]. Returns the n_tokens chosen token ids [n_tokens] int64. `give_up` is not asked: the
        cycle is one device graph and runs to its end (model/backend.py)."""
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
        self.last_cycle_ms = (after_prefill.time_since(start), end.time_since(after_prefill))
        return tokens

    @on_device
    def prefill_logits(self) -> np.ndarray:
        """Full-vocabulary logits [vocab] of the last prefill row of the latest run_cycle_tokens (the
        cycle itself scores only the action bins). For checks and debugging, not for the cycle path."""
        if not self.has_prefill_logits:
            raise RuntimeError("prefill_logits: no device cycle has run yet")
        sp = self.spec
        self.kernels.rmsnorm(self.prefill_last, self.final_norm, self.normed, 1, sp.rms_norm_eps, self.stream)
        self.kernels.projection(self.head, self.normed, self.logits, 1, ck.MODE_STORE, self.stream)
        return self._get(self.logits, 1)[0]

    @on_device
    def begin_cycle(self, prefill_x, positions, write_slots, context_slots, decode_slots, decode_positions,
                    n_tokens: int) -> None:
        """Upload one cycle's rows, tables and control block (async on self.stream)."""
        self._require_no_layered("begin_cycle")
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
        self._put_forward_tables(all_pos, all_slots, context_slots)
        self._put(self.ctl, np.array([0, context_slots.size, 0, -1], np.int32))

    @on_device
    def prepare_cycle(self, prefill_rows: int, action_bin_lo: int, n_bins: int) -> None:
        """Capture (not run) the graphs a cycle with this prefill length needs, so the first such cycle only
        replays them: configure and instruction changes call it, never a live cycle."""
        if not self.use_graphs:
            return
        bins = self._bins(action_bin_lo, n_bins)
        self._graph(("prefill", prefill_rows) + bins, lambda: self._enqueue_prefill(prefill_rows, *bins))
        self._graph(("decode",) + bins, lambda: self._enqueue_decode(*bins))

    @on_device
    def prepare_forward(self, row_counts, pieces: int = 1) -> None:
        """Capture (not run) the layer graphs of every pass a forward() over each of these row counts makes; with
        pieces > 1 also those of a layered forward in that many pieces (begin_layered), for the row counts one
        pass holds."""
        if not self.use_graphs:
            return
        for total in sorted({int(n) for n in row_counts}):
            for _start, n, bulk in self._passes(total):
                if bulk:
                    self._graph(("bulk", n), lambda n=n: self._enqueue_bulk_layers(n))
                else:
                    self._graph(("layers", n), lambda n=n: self._enqueue_layers(n))
            if pieces > 1 and self.layered_rows_fit(total):
                for layers in layer_pieces(self.spec.num_layers, pieces):
                    self._graph(*self._piece_graph(total, layers))

    def layered_rows_fit(self, rows: int) -> bool:
        """Whether a forward of `rows` rows can run piece by piece: one pass holds it."""
        return len(self._passes(int(rows))) == 1

    @on_device
    def begin_layered(self, x: np.ndarray, positions: np.ndarray, write_slots: np.ndarray,
                      context_slots: np.ndarray, pieces: int) -> LayeredForward:
        """forward(..., logits="none") in `pieces` runs of layers (model/layered_forward.py): the rows, tables and
        control block uploaded as forward() uploads them, nothing run. The rows must fit one pass
        (layered_rows_fit); nothing else may run on this backend until the last piece (or abandon_layered)."""
        self._require_no_layered("begin_layered")
        x, positions, write_slots, context_slots = self._check_inputs(x, positions, write_slots, context_slots, "none")
        if not self.layered_rows_fit(x.shape[0]):
            raise ValueError(f"begin_layered: {x.shape[0]} rows take {len(self._passes(x.shape[0]))} passes; a "
                             f"forward run piece by piece must fit one")
        self._put_forward_tables(positions, write_slots, context_slots)
        self._put_pass(x, 0, context_slots.size)
        return self._start_layered(x.shape[0], pieces)

    @on_device
    def run_layer_piece(self, lf: LayeredForward) -> bool:
        """Queue the next piece of `lf`'s layers (its graph, captured ahead by prepare_forward); True once its last
        piece is queued (synchronize to wait for it)."""
        self._run_graph(*self._piece_graph(lf.rows, self._next_layers(lf)))
        return self._piece_ran(lf)

    def _put_forward_tables(self, positions, write_slots, context_slots) -> None:
        """A forward's positions, write slots and attend list (the context, then its own rows) onto the device."""
        self._put(self.pos_table, positions.astype(np.int32))
        self._put(self.slot_table, write_slots.astype(np.int32))
        self._put(self.attend_list, np.concatenate([context_slots, write_slots]).astype(np.int32))

    def _put_pass(self, rows: np.ndarray, start: int, context: int) -> None:
        """One pass's residual rows and control block (its first row's index, the context length)."""
        self._put(self.resid, rows)
        self._put(self.ctl, np.array([start, context, 0, 0], np.int32))

    def _piece_graph(self, rows: int, layers: tuple) -> tuple:
        """(graph key, what the graph records) of one piece of a layered forward of `rows` rows. A piece of every
        layer (a layered forward in one piece) is the whole forward's pass: its graph, which prepare_forward
        captures for any piece count."""
        layers = tuple(layers)
        bulk = self._passes(rows)[0][2]
        if layers == (0, self.spec.num_layers):
            if bulk:
                return ("bulk", rows), lambda: self._enqueue_bulk_layers(rows)
            return ("layers", rows), lambda: self._enqueue_layers(rows)
        if bulk:
            return ("bulk", rows) + layers, lambda: self._enqueue_bulk_layers(rows, layers=layers)
        return ("layers", rows) + layers, lambda: self._enqueue_layers(rows, layers=layers)

    def _passes(self, total: int) -> list[tuple[int, int, bool]]:
        """(first row, rows, bulk) of each pass of a forward over `total` rows: passes of bulk_max_rows through the
        bulk prefill when total reaches bulk_min_rows (model.bulk_prefill_min_rows; 0: never), else of max_rows
        through the cycle's prefill kernels."""
        bulk = 0 < self.bulk_min_rows <= total
        step = self.bulk_max_rows if bulk else self.max_rows
        return [(start, min(step, total - start), bulk) for start in range(0, total, step)]

    @on_device
    def launch_prefill(self, n_rows: int, bin_lo: int, n_bins: int) -> None:
        """Enqueue (or replay) the prefill of n_rows rows ending with the restricted argmax."""
        self.has_prefill_logits = True
        self._run_graph(("prefill", n_rows, bin_lo, n_bins), lambda: self._enqueue_prefill(n_rows, bin_lo, n_bins))

    @on_device
    def launch_decode_step(self, bin_lo: int, n_bins: int) -> None:
        """Enqueue (or replay) one decode step: gather the last token, 1-row forward, restricted argmax."""
        self._run_graph(("decode", bin_lo, n_bins), lambda: self._enqueue_decode(bin_lo, n_bins))

    @on_device
    def finish_cycle(self, n_tokens: int) -> np.ndarray:
        tokens = self._get(self.tokens_out, n_tokens).astype(np.int64)
        bad = np.flatnonzero(tokens < 0)
        if bad.size:
            raise NonFiniteActionError(f"non-finite logits at action token {int(bad[0])} of {n_tokens} (device argmax)")
        return tokens

    @on_device
    def device_buffer(self, shape, dtype, host: np.ndarray | None = None):
        """A device array for a helper on this backend's device (cuda_vision.py), counted and freed by close();
        filled from `host` when given, else zeroed."""
        if host is None:
            return self._alloc(shape, dtype)
        if np.asarray(host).size != int(np.prod(shape)):
            raise ValueError(f"device_buffer: {np.asarray(host).size} host values for shape {tuple(shape)}")
        arr = self._alloc(shape, dtype, zero=False)
        self._drv.memcpy_htod(int(arr.gpudata), np.ascontiguousarray(host, dtype=dtype))
        return arr

    def patch_projection(self, weight: np.ndarray, bias: np.ndarray, grid_rows: int, grid_cols: int, patch: int):
        """The vision encoder's patch projection on this device (vision.on_gpu): model/cuda_vision.py."""
        from .cuda_vision import CudaPatchProjection
        return CudaPatchProjection(self, weight, bias, grid_rows, grid_cols, patch)

    @on_device
    def use_kernel_plan(self, plan: KernelPlan) -> KernelPlan:
        """Between cycles: launch the kernels `plan` names from now on. The captured graphs are dropped (the next
        cycle captures them anew) and every kernel the plan needs is loaded here, outside any capture. A choice
        this device or model cannot run falls back, logged: fp32 weights take neither the tensor-core attention
        nor the persistent decode, a head_dim other than 128 has attention_mma.cu's 1-block entry only, a device
        without sm_90 launches ordinarily and one without sm_90a takes the "mma" bulk GEMM; INT4 projections take
        neither the staged projections nor the persistent decode (bf16 kernels; cuda_kernel_plan.py), and float
        ones not the staged INT4 projections nor the INT4 decode grid (int4_gemv_*); a model with grouped queries
        keeps the decode attention's entries for any group (decode_attention_one_head_entry off, said at debug
        level since the default plan asks for it; without grouped queries it sets head_split 1). Returns the plan
        in effect (also `kernel_plan`)."""
        _check_plan_type(plan)
        self._require_no_layered("use_kernel_plan")        # its pieces left would run another plan's kernels
        self._drop_graphs()
        staged = plan.staged_prefill_projections and self.dtype == "bfloat16" and not self.int4
        if plan.staged_prefill_projections and not staged:
            log.info("staged prefill projections multiply bf16 weights only: %s projections take %s", self._weights_kind(),
                     "projection_int4.cu" if self.int4 else "projection_f32.cu")
        if staged:
            self.kernels.load_family("projection_staged")   # on demand, but its first launch may be in a capture
        staged_int4 = plan.staged_int4_prefill_projections and self.int4
        if plan.staged_int4_prefill_projections and not staged_int4:
            log.info("staged INT4 prefill projections multiply INT4 weights only: %s projections keep %s",
                     self._weights_kind(), "projection_staged.cu / projection_bf16.cu" if self.dtype == "bfloat16"
                     else "projection_f32.cu")
        if staged_int4:
            self.kernels.load_family("projection_int4_staged")   # as projection_staged, before any capture
        group = self.spec.num_heads // self.spec.num_kv_heads      # query heads per KV head
        heads_per_warp = plan.bulk_attention_heads_per_warp
        if heads_per_warp == 2 and group % 2:
            log.info("two query heads per flash-attention warp need an even head group; this model's is %d: one "
                     "head per warp", group)
            heads_per_warp = 1
        tile_entries = plan.bulk_attention_tile_entries
        if tile_entries > FLASH_BKV and group > FLASH_WIDE_MAX_GROUP:
            log.info("%d-entry flash-attention tiles take at most %d query heads per KV head; this model has %d: "
                     "%d-entry tiles", tile_entries, FLASH_WIDE_MAX_GROUP, group, FLASH_BKV)
            tile_entries = FLASH_BKV
        if plan.bulk_attention_kv_overlap and self.bulk_min_rows:
            # on demand, but a first launch may be in a capture
            self.kernels.load_family("attention_flash_tiles" if plan.bulk_attention_hoisted_copies
                                     else "attention_flash_kvo")
        if (plan.int4_prefill_activation_parts != 2 or plan.int4_prefill_activation_prefetch) and not staged_int4:
            log.info("one activation part and the activation prefetch are entries of the staged INT4 projections; "
                     "%s prefill projections take neither", self._weights_kind())
        in_effect = {"staged_prefill_projections": staged, "staged_int4_prefill_projections": staged_int4,
                     "int4_prefill_activation_parts": plan.int4_prefill_activation_parts if staged_int4 else 2,
                     "int4_prefill_activation_prefetch": plan.int4_prefill_activation_prefetch and staged_int4,
                     "bulk_attention_heads_per_warp": heads_per_warp, "bulk_attention_tile_entries": tile_entries,
                     **self._int4_in_effect(plan),
                     **self._attention_in_effect(plan),
                     "persistent_decode": self._persistent_in_effect(plan), "bulk_gemm": self._bulk_gemm_in_effect(plan)}
        # Last, once every family of the plan is loaded: the programmatic launcher copies their shared-memory limits.
        if plan.programmatic_launch:
            in_effect["programmatic_launch"] = self.kernels.enable_programmatic_launch()
        else:
            self.kernels.disable_programmatic_launch()
        self.kernel_plan = dataclasses.replace(plan, **in_effect)
        return self.kernel_plan

    def _drop_graphs(self) -> None:
        """Forget the captured graphs (a kernel choice changed): the next cycle captures them anew."""
        self.stream.synchronize()
        for graph in self._graphs.values():
            graph.close()
        self._graphs.clear()

    def memory_bytes(self) -> int:
        """Device bytes held: weights + KV arena + scratch (all allocated in the constructor)."""
        return int(self._bytes)

    def decode_stream_bytes(self, n_bins: int) -> int:
        """Bytes one restricted decode step must read at least: layer weights + the n_bins head rows."""
        row = self.spec.hidden_size * (2 if self.dtype == "bfloat16" else 4)
        return int(self.layer_weight_bytes + n_bins * row)

    def close(self) -> int:
        """Free the device memory (weights, KV arena, scratch, graphs) now; returns the bytes freed.
        The backend is unusable afterwards; a second close frees nothing."""
        if self.closed:
            return 0
        self.closed = True
        with self.device.bound():
            self.stream.synchronize()
        freed = self._free_buffers()
        self.layers = []
        self._landing = None
        self._bytes = 0
        log.info("CudaBackend closed: %.2f GiB of device memory freed", freed / GIB)
        return freed

    # ------------------------------------------------------------------ Internal helpers

    def _int4_in_effect(self, plan: KernelPlan) -> dict:
        """The INT4 decode projections' grid and entries of `plan` this backend runs (gemv_int4.cu), and whether
        its projections of many rows take their lean entries: as asked for INT4 weights, except the lean entries for
        a group they cannot index (said at info level); off for float weights, whose kernels take none of them (said
        too when asked)."""
        asked = {name: getattr(plan, name) for name in INT4_DECODE_OFF}
        if not self.int4:
            if asked != INT4_DECODE_OFF or plan.int4_prefill_lean_loop:
                log.info("the INT4 decode grid and entries (%s) and int4_prefill_lean_loop apply to INT4 weights only: "
                         "%s projections keep their kernels", ", ".join(INT4_DECODE_OFF), self._weights_kind())
            return {**INT4_DECODE_OFF, "int4_prefill_lean_loop": False}
        indexable = lean_int4_group(self.int4_group)
        if (plan.int4_decode_lean_loop or plan.int4_prefill_lean_loop) and not indexable:
            log.info("the lean INT4 entries find a chunk's scale group by a shift (groups of 32 x a power of two); "
                     "this snapshot's groups of %d keep the other entries", self.int4_group)
        return {**asked, "int4_decode_lean_loop": plan.int4_decode_lean_loop and indexable,
                "int4_prefill_lean_loop": plan.int4_prefill_lean_loop and indexable}

    def _attention_in_effect(self, plan: KernelPlan) -> dict:
        """The attention fields of `plan` this model can run, attention_mma.cu loaded where it is chosen."""
        tensor_cores = plan.tensor_core_attention
        if tensor_cores and (self.dtype != "bfloat16" or self.spec.head_dim not in ca.ATTN_MMA_HEAD_DIMS):
            log.info("tensor-core attention serves bf16 models with head_dim in %s; %s with head_dim %d keeps "
                     "attention_tiled.cu", ca.ATTN_MMA_HEAD_DIMS, self.dtype, self.spec.head_dim)
            tensor_cores = False
        if tensor_cores:
            self.kernels.load_family("attention_mma")
        blocks = plan.attention_blocks_per_sm if self.spec.head_dim == 128 else 1   # the 2-block entry: hd 128 only
        masked = plan.attention_masked_softmax and tensor_cores and self.spec.head_dim == 128   # _ma: hd 128 only
        if plan.attention_masked_softmax and not masked:
            log.info("attention_mma.cu's masked-softmax entries serve bf16 models with head_dim 128 on the tensor "
                     "cores; this one (%s, head_dim %d) keeps the entry it has", self.dtype, self.spec.head_dim)
        halves = (plan.attention_head_halves and tensor_cores and self.spec.head_dim == 128 and blocks == 2
                  and not masked)
        if plan.attention_head_halves and not halves:
            log.info("attention_mma.cu's head-halves entry serves bf16 models with head_dim 128 on the tensor cores, "
                     "two blocks per SM, without the masked softmax; this plan (%s, head_dim %d, %d blocks per SM%s) "
                     "keeps the entry it has", self.dtype, self.spec.head_dim, blocks,
                     ", masked softmax" if masked else "")
        # The decode row follows: on the tensor cores only where the prefill attention is.
        decode_tensor_cores = plan.decode_attention_tensor_cores and tensor_cores
        one_head = plan.decode_attention_one_head_entry and not decode_tensor_cores   # an attention_decode.cu entry
        if one_head and self.spec.num_heads != self.spec.num_kv_heads:
            log.debug("the one-head decode attention entry serves models without grouped queries; this one has %d "
                      "query heads per KV head", self.spec.num_heads // self.spec.num_kv_heads)
            one_head = False
        head_split = 1 if one_head else plan.decode_attention_head_split
        prefetch = plan.decode_attention_prefetch and not decode_tensor_cores and head_split == 1
        if plan.decode_attention_prefetch and not prefetch:      # debug: the default plan asks for it
            log.debug("the decode attention's prefetching entries have one warp per 8-entry group; this plan takes %s: "
                      "no prefetch", "the tensor cores" if decode_tensor_cores else f"head_split {head_split}")
        group = self.spec.num_heads // self.spec.num_kv_heads
        exact = (plan.decode_attention_exact_group and not decode_tensor_cores and not one_head
                 and ca.exact_group_entry(group, self.spec.head_dim, head_split, prefetch))
        if plan.decode_attention_exact_group and not exact:
            log.info("no decode attention entry for exactly group %d (head_dim %d, head_split %d, prefetch %s%s): the "
                     "entry for any group serves", group, self.spec.head_dim, head_split, prefetch,
                     ", the tensor cores" if decode_tensor_cores else ", the one-head entry" if one_head else "")
        return {"tensor_core_attention": tensor_cores, "attention_blocks_per_sm": blocks,
                "attention_masked_softmax": masked, "attention_head_halves": halves,
                "decode_attention_tensor_cores": decode_tensor_cores,
                "decode_attention_one_head_entry": one_head, "decode_attention_head_split": head_split,
                "decode_attention_prefetch": prefetch, "decode_attention_exact_group": exact}

    def _persistent_in_effect(self, plan: KernelPlan) -> bool:
        """Whether decode steps run as one persistent kernel, decode_persistent.cu prepared where they do."""
        if not plan.persistent_decode:
            return False
        if not self._persistent_capable():
            log.warning("persistent decode streams bf16 weights only; %s decodes with one launch per kernel",
                        self._weights_kind())
            return False
        sp = self.spec
        grid = self.kernels.prepare_decode_layers(sp.hidden_size, sp.intermediate_size, sp.num_heads,
                                                  sp.num_kv_heads, sp.head_dim, plan.persistent_blocks_per_sm)
        log.info("persistent decode: one cooperative launch of %d blocks per step, L2 prefetch %d bytes", grid,
                 plan.persistent_l2_prefetch_bytes)
        return True

    def _bulk_gemm_in_effect(self, plan: KernelPlan) -> str:
        """The bulk GEMM this device can run (wgmma needs sm_90a; else gemm_bulk.cu's mma.sync), loaded when the
        bulk prefill is on."""
        gemm = plan.bulk_gemm
        if ck.family_arch(BULK_GEMMS[gemm].family, self.kernels.arch) is None:
            gemm = "mma"
        if self.bulk_min_rows:
            self.kernels.load_family(BULK_GEMMS[gemm].family)
        return gemm

    def _weights_kind(self) -> str:
        """What the projections are, for the log: 'INT4', 'bfloat16' or 'float32'."""
        return "INT4" if self.int4 else self.dtype

    def _bins(self, action_bin_lo: int, n_bins: int | None) -> tuple[int, int]:
        n_bins = self.spec.vocab_size - action_bin_lo if n_bins is None else n_bins
        if not (0 <= action_bin_lo and n_bins > 0 and action_bin_lo + n_bins <= self.spec.vocab_size):
            raise ValueError(f"action bins [{action_bin_lo}, {action_bin_lo + n_bins}) outside the vocabulary of "
                             f"{self.spec.vocab_size}")
        return int(action_bin_lo), int(n_bins)

    def _kv_ptrs(self, layer: int) -> tuple[int, int]:
        off = layer * self._layer_stride
        return int(self.k_cache.gpudata) + off, int(self.v_cache.gpudata) + off

    def _run_graph(self, key, record) -> None:
        if not self.use_graphs:
            record()
            return
        self._graph(key, record, ahead=False).launch(self.stream)

    def _graph(self, key, record, ahead: bool = True):
        """The captured graph for `key`, capturing it now if needed (capture records, it runs nothing). ahead:
        asked for by a prepare call (configure, an instruction change) rather than met by a forward."""
        graph = self._graphs.get(key)
        if graph is None:
            from .cuda_graphs import capture
            t = time.perf_counter()
            graph = capture("-".join(map(str, key)), self.stream, record)
            self._graphs[key] = graph
            # A capture met by a forward costs that forward a few ms and keeps host memory in the driver for good
            # (the GPU soaks' RSS steps of a few MiB were not explained): said at INFO, with the count held.
            log.log(logging.DEBUG if ahead else logging.INFO,
                    "CUDA graph %s captured %s in %.1f ms (%d nodes); %d graphs held", graph.name,
                    "ahead" if ahead else "while serving", (time.perf_counter() - t) * 1e3, graph.n_nodes,
                    len(self._graphs))
        return graph

    def _put(self, dst, host: np.ndarray) -> None:
        """Copy a host array into the start of a device buffer, ordered on self.stream. The driver stages a
        pageable array before it returns; up to SHORT_COPY_BYTES the call keeps the interpreter lock
        (cuda_gil_held.py), so a cycle's input uploads never wait for another thread of the node to give it back."""
        host = np.ascontiguousarray(host, dtype=dst.dtype)
        if host.size > dst.size:
            raise ValueError(f"{host.size} values do not fit a device buffer of {dst.size}")
        if host.nbytes > SHORT_COPY_BYTES:
            self._drv.memcpy_htod_async(int(dst.gpudata), host, self.stream)
        elif host.size:
            copy_htod_async(int(dst.gpudata), host, self.stream)

    def _get(self, src, n_rows: int) -> np.ndarray:
        """Synchronize and copy the first n_rows of a device buffer to the host. The wait gives the interpreter
        lock up (it lasts the cycle's device work); a copy of up to SHORT_COPY_BYTES after it keeps it
        (cuda_gil_held.py), so that the cycle thread, once it has the lock back, does not queue for it again."""
        self.stream.synchronize()
        view = src[:n_rows]
        if view.nbytes > SHORT_COPY_BYTES:
            return view.get()
        out = np.empty(view.shape, view.dtype)
        copy_dtoh(out, int(view.gpudata))
        return out

    def _check_inputs(self, x, positions, write_slots, context_slots, logits):
        return check_forward_inputs(self.spec.hidden_size, self._slot_marks, x, positions, write_slots,
                                    context_slots, logits)

    def _slot_array(self, slots, name: str) -> np.ndarray:
        return slot_array(slots, name, self.capacity)


def _check_plan_type(plan) -> None:
    """A plan is a KernelPlan, whose own checks ran when it was made (a dict of switches would be read as nothing)."""
    if not isinstance(plan, KernelPlan):
        raise ValueError(f"CudaBackend needs a cuda_kernel_plan.KernelPlan, got {type(plan).__name__} {plan!r}")


def _with_bulk_precision(plan: KernelPlan, precision: str) -> KernelPlan:
    """`plan` with the bulk prefill's activation parts that model.bulk_prefill_precision names: the robot's choice
    of precision, not a kernel choice, so it is configured (the lab's use_kernel_plan may still vary it)."""
    if precision not in BULK_PRECISION_PARTS:
        raise ValueError(f"bulk_prefill_precision must be one of {tuple(BULK_PRECISION_PARTS)}, got {precision!r}")
    return dataclasses.replace(plan, bulk_activation_parts=BULK_PRECISION_PARTS[precision])


def _check_model(spec: ModelSpec, capacity: int, max_rows: int) -> None:
    """Shapes the kernels need, with errors naming the offending dimension."""
    if capacity <= 0:
        raise ValueError(f"capacity must be > 0 KV slots, got {capacity}")
    if max_rows <= 0:
        raise ValueError(f"max_rows must be > 0, got {max_rows}")
    for name in ("hidden_size", "intermediate_size", "q_dim"):
        value = getattr(spec, name)
        if value % 32:
            raise ValueError(f"CudaBackend needs {name} % 32 == 0 (projection K steps of 32), got {value}")
    group = spec.num_heads // spec.num_kv_heads
    if group > ATTN_MAX_GROUP or spec.head_dim > ca.ATTN_MAX_HEAD_DIM or spec.head_dim % 2:
        raise ValueError(f"CudaBackend attention supports head groups <= {ATTN_MAX_GROUP} and even head_dim <= "
                         f"{ca.ATTN_MAX_HEAD_DIM}; got group {group}, head_dim {spec.head_dim}")
    if not math.isfinite(spec.rope_theta) or spec.rope_theta <= 0:
        raise ValueError(f"rope_theta must be a positive number, got {spec.rope_theta}")


# The INT4 decode projections' choices (KernelPlan) as a float backend runs them: off.
INT4_DECODE_OFF = {"int4_gemv_items_per_block": 0, "int4_gemv_rows_per_warp": 1, "int4_decode_lean_loop": False}


def _check_int4_group(group: int) -> None:
    """The INT4 kernels read 16-byte chunks of 32 columns, each inside one scale group: G % 32 == 0."""
    if group and group % 32:
        raise ValueError(f"the CUDA INT4 kernels need a group size that is a multiple of 32, the snapshot has "
                         f"{group}; quantize with --group-size 32, 64 or 128, or run it on the numpy backend")


def _bulk_rows(spec: ModelSpec, dtype: str, min_rows: int, max_rows: int, int4: bool = False) -> tuple[int, int]:
    """(bulk_min_rows, bulk_max_rows) in effect: (0, 0) when the bulk prefill is off or cannot serve this model
    (said in the log), ValueError for impossible values."""
    if min_rows < 0 or max_rows < 1:
        raise ValueError(f"bulk prefill rows: min {min_rows} must be >= 0 (0: off), max {max_rows} >= 1")
    if min_rows == 0:
        return 0, 0
    why = None
    if int4:
        # The bulk GEMMs stage bf16 weight tiles in shared memory (cp.async, ldmatrix; wgmma reads them from
        # there): INT4 would need its own dequantizing tile loader. The simplest correct path instead is
        # projection_int4.cu, the cycle's own INT4 kernel, over passes of max_rows rows: the reconciler's KV is
        # then computed by the very kernels (and w_hat = q * scale) the primary's prefill uses, and a long forward
        # is compute-bound either way (INT4 saves bytes, not products).
        why = "INT4 projections (its GEMMs stage bf16 weight tiles; projection_int4.cu runs long forwards in passes)"
    elif dtype != "bfloat16":
        why = f"{dtype} weights (its GEMMs multiply bf16 weights)"
    elif spec.head_dim not in FLASH_HEAD_DIMS:
        why = f"head_dim {spec.head_dim} (its attention has entries for {FLASH_HEAD_DIMS})"
    elif (spec.q_dim + 2 * spec.kv_dim) % 2:
        why = f"q|k|v width {spec.q_dim + 2 * spec.kv_dim} is odd"
    if why is not None:
        log.info("bulk prefill off for this model: %s; long forwards take the cycle's prefill kernels", why)
        return 0, 0
    return min_rows, max_rows
