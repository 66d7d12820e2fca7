"""Where a CudaBackend's bytes live: the plan of every device buffer (checked against the VRAM ceiling before
anything is allocated), the weight upload in the layouts the kernels read, and the state buffers. A base class
of cuda_backend.CudaBackend, whose constructor calls _plan, _upload_weights and _allocate_state once.

An INT4 snapshot (self.int4) uploads its seven projections per layer as stored, packed nibbles and fp16 scales
(cuda_int4_launchers.Int4Matrix), in the same row layouts (the rows of packed and scales permuted together);
the embedding, head, norms and biases as for a float snapshot, in the backend's dtype."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import cuda_kernels as ck
from .cuda_attention_launchers import ATTN_CHUNK
from .cuda_int4_launchers import Int4Matrix
from .weight_layouts import (int4_rows, interleave_gate_up, interleave_gate_up_int4, permute_rows, qkv_rope_row_order,
                             rope_inv_freq)
from .weights import BIAS_FIELDS, GLOBAL_TENSOR_NAMES, LAYER_TENSOR_NAMES, round_to_bf16

MAX_CYCLE_TOKENS = 256          # action tokens one cycle may emit
UPLOAD_BLOCK_BYTES = 64 << 20   # rows of the embedding table per host->device copy: bounds the host's share
# The bulk prefill's attention partial sums hold this many times bulk_max_rows rows (a short pass splits its list over
# as many blocks).
BULK_PARTIAL_ROWS = 2


@dataclass
class LayerWeights:
    """One decoder layer's tensors on the device (GPUArrays; shapes as below)."""
    input_norm: object      # [hidden] f32
    post_norm: object       # [hidden] f32
    w_qkv: object           # [q+2kv, hidden] bf16 bits / f32 / Int4Matrix (every projection of an INT4 snapshot)
    w_qkv_rope: object      # [qkv_rope rows, hidden] in qkv_rope_row_order, decode only (None for f32 weights)
    b_qkv: object           # [q+2kv] f32 or None
    w_o: object             # [hidden, q_dim]
    w_gate_up: object       # [2 ceil8(inter), hidden] interleaved
    w_down: object          # [hidden, inter]


class DeviceMemory:
    """The device buffers of a CudaBackend (see the module docstring)."""

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
            plan.update(self._matrix_plan(f"layer{i}.qkv", qkv_rows, sp.hidden_size, wdt))
            if self._decode_pipeline():
                plan.update(self._matrix_plan(f"layer{i}.qkv_rope", len(self._rope_order()), sp.hidden_size, wdt))
            if sp.qkv_bias:
                plan[f"layer{i}.qkv_bias"] = ((qkv_rows,), np.float32)
            plan.update(self._matrix_plan(f"layer{i}.o", sp.hidden_size, sp.q_dim, wdt))
            plan.update(self._matrix_plan(f"layer{i}.gate_up", 2 * i8, sp.hidden_size, wdt))
            plan.update(self._matrix_plan(f"layer{i}.down", sp.hidden_size, sp.intermediate_size, wdt))
        kv = (sp.num_layers, sp.num_kv_heads, self.capacity, sp.head_dim)
        self.n_splits = -(-self.capacity // ATTN_CHUNK)
        rows = self._stream_rows()
        plan.update({
            "k_cache": (kv, self.kv_element), "v_cache": (kv, self.kv_element),
            "resid": ((rows, sp.hidden_size), np.float32), "normed": ((rows, sp.hidden_size), np.float32),
            "prefill_last": ((1, sp.hidden_size), np.float32),
            "qkv": ((rows, qkv_rows), np.float32), "attn": ((m, sp.q_dim), np.float32),
            "act": ((m, sp.intermediate_size), np.float32),
            "part_o": ((m, sp.num_heads, self.n_splits, sp.head_dim), np.float32),
            "part_ml": ((m, sp.num_heads, self.n_splits, 2), np.float32),
            "logits": ((m, sp.vocab_size), np.float32),
            "tables": ((3 * self.capacity + m + ck.CTL_INTS + MAX_CYCLE_TOKENS,), np.int32),
            "kv_staging": ((2, sp.num_layers, m, sp.kv_dim), self.kv_element), "kv_slots": ((self.capacity,), np.int32),
        })
        if self._persistent_capable():
            plan["decode_layer_table"] = ((sp.num_layers, ck.DECODE_LAYER_POINTERS), np.uint64)
            plan["decode_counters"] = ((2,), np.uint32)
        if self.bulk_min_rows:
            plan.update(self._bulk_plan())
        return plan

    def _matrix_plan(self, name: str, rows: int, cols: int, wdt) -> dict:
        """The buffers of one projection [rows, cols]: in the weight dtype, or INT4's packed nibbles and scales."""
        if not self.int4:
            return {name: ((rows, cols), wdt)}
        return {f"{name}.packed": ((rows, cols // 2), np.uint8),
                f"{name}.scales": ((rows, cols // self.int4_group), np.uint16)}

    def _decode_pipeline(self) -> bool:
        """One-row calls take the fused decode pipeline (gemv.cu / gemv_int4.cu): bf16 or INT4 projections."""
        return self.dtype == "bfloat16" or self.int4

    def _persistent_capable(self) -> bool:
        """decode_persistent.cu can run this model (it streams bf16 projections only)."""
        return self.dtype == "bfloat16" and not self.int4

    def _stream_rows(self) -> int:
        """Rows of the residual stream, norm and q|k|v buffers: a cycle's pass, or a bulk pass."""
        return max(self.max_rows, self.bulk_max_rows if self.bulk_min_rows else 0)

    def _bulk_plan(self) -> dict:
        """The bulk prefill's own buffers: activations as bf16 hi/lo for the GEMMs (the normed rows or the
        attention output; the SwiGLU output), the staged K/V of one layer, the attention's partial sums."""
        sp, b = self.spec, self.bulk_max_rows
        return {"bulk_x": ((2 * b * max(sp.hidden_size, sp.q_dim),), np.uint16),
                "bulk_act": ((2 * b * sp.intermediate_size,), np.uint16),
                "bulk_stage": ((4, sp.num_kv_heads, self.capacity, sp.head_dim), np.uint16),
                "bulk_part_o": ((BULK_PARTIAL_ROWS * b * sp.q_dim,), np.float32),
                "bulk_part_ml": ((BULK_PARTIAL_ROWS * b * sp.num_heads * 2,), np.float32)}

    def _rope_order(self) -> np.ndarray:
        sp = self.spec
        return qkv_rope_row_order(sp.num_heads, sp.num_kv_heads, sp.head_dim)

    def _alloc(self, shape, dtype, zero: bool = True):
        arr = self._gpuarray.empty(shape, dtype)
        self._buffers.append(arr)
        self._bytes += arr.nbytes
        if zero:
            self._drv.memset_d8(int(arr.gpudata), 0, arr.nbytes)
        return arr

    def _to_device(self, host: np.ndarray):
        """A device copy of a host array (float32 or uint16 bf16 bits), counted and freed by close()."""
        arr = self._alloc(host.shape, host.dtype, zero=False)
        self._drv.memcpy_htod(int(arr.gpudata), np.ascontiguousarray(host))
        return arr

    def _read(self, source, name: str, wdt, rows=None) -> np.ndarray:
        """One tensor (or rows of it) on the host as the device stores it: bf16 bits for wdt uint16, else float32."""
        return source.read(name, "bf16" if wdt == np.uint16 else "f32", rows=rows)

    def _read_small(self, source, name: str) -> np.ndarray:
        """Norm weights and biases: float32 on the device; a bf16 model's are bf16 values (rounded as HF stores them)."""
        host = source.read(name, "f32")
        return round_to_bf16(host) if self.dtype == "bfloat16" else host

    def _upload_rows(self, source, name: str, wdt):
        """A big 2-D tensor (embedding, separate head) uploaded in blocks of rows, so the host never holds it whole."""
        rows, cols = source.shape(name)
        arr = self._alloc((rows, cols), wdt, zero=False)
        row_bytes = cols * np.dtype(wdt).itemsize
        step = max(1, UPLOAD_BLOCK_BYTES // row_bytes)
        for r0 in range(0, rows, step):
            block = self._read(source, name, wdt, rows=(r0, min(rows, r0 + step)))
            self._drv.memcpy_htod(int(arr.gpudata) + r0 * row_bytes, np.ascontiguousarray(block))
        return arr

    def _upload_weights(self, source, wdt) -> None:
        """Every weight tensor to the device in its stored format, one tensor (or row block) on the host at a time."""
        sp = self.spec
        self.embed_table = self._upload_rows(source, GLOBAL_TENSOR_NAMES["embed"], wdt)           # [vocab, hidden]
        self.head = self.embed_table if source.tied else self._upload_rows(source, GLOBAL_TENSOR_NAMES["lm_head"], wdt)
        self.final_norm = self._to_device(self._read_small(source, GLOBAL_TENSOR_NAMES["final_norm"]))   # [hidden]
        self.inv_freq = self._to_device(rope_inv_freq(sp.rope_theta, sp.head_dim))                      # [hd/2], never rounded
        before = self._bytes
        self.layers = [self._upload_layer(source, i, wdt) for i in range(sp.num_layers)]
        # A pass streams one of the two q|k|v layouts: count one.
        duplicate = sum(layer.w_qkv_rope.nbytes for layer in self.layers if layer.w_qkv_rope is not None)
        self.layer_weight_bytes = self._bytes - before - duplicate

    def _upload_layer(self, source, i: int, wdt) -> LayerWeights:
        """Decoder layer i's tensors to the device (its projections as _float_projections / _int4_projections)."""
        sp = self.spec
        name = {f: t.format(i=i) for f, t in LAYER_TENSOR_NAMES.items()}
        b_qkv = None
        if sp.qkv_bias:
            b_qkv = self._to_device(np.concatenate([self._read_small(source, name[f]) for f in BIAS_FIELDS]))
        projections = self._int4_projections if self.int4 else self._float_projections
        return LayerWeights(input_norm=self._to_device(self._read_small(source, name["input_norm"])),
                            post_norm=self._to_device(self._read_small(source, name["post_norm"])),
                            b_qkv=b_qkv, **projections(source, name, wdt))

    def _float_projections(self, source, name: dict, wdt) -> dict:
        """The LayerWeights projection fields from float tensors, in the backend's weight dtype."""
        w_qkv = np.concatenate([self._read(source, name[f], wdt) for f in ("q_proj", "k_proj", "v_proj")])   # [q+2kv, hidden]
        gate_up = interleave_gate_up(self._read(source, name["gate_proj"], wdt), self._read(source, name["up_proj"], wdt))
        return {"w_qkv": self._to_device(w_qkv),
                "w_qkv_rope": self._to_device(permute_rows(w_qkv, self._rope_order())) if self._decode_pipeline() else None,
                "w_o": self._to_device(self._read(source, name["o_proj"], wdt)),
                "w_gate_up": self._to_device(gate_up),
                "w_down": self._to_device(self._read(source, name["down_proj"], wdt))}

    def _int4_projections(self, source, name: dict, wdt) -> dict:
        """The LayerWeights projection fields of an INT4 snapshot: Int4Matrix each, in the same row layouts."""
        q, k, v = (source.read_int4(name[f]) for f in ("q_proj", "k_proj", "v_proj"))
        qkv = (np.concatenate([q[0], k[0], v[0]]), np.concatenate([q[1], k[1], v[1]]))        # [q+2kv, hidden / 2 | / G]
        gate_up = interleave_gate_up_int4(source.read_int4(name["gate_proj"]), source.read_int4(name["up_proj"]))
        return {"w_qkv": self._int4_to_device(*qkv),
                "w_qkv_rope": self._int4_to_device(*int4_rows(*qkv, self._rope_order())),
                "w_o": self._int4_to_device(*source.read_int4(name["o_proj"])),
                "w_gate_up": self._int4_to_device(*gate_up),
                "w_down": self._int4_to_device(*source.read_int4(name["down_proj"]))}

    def _int4_to_device(self, packed: np.ndarray, scales: np.ndarray) -> Int4Matrix:
        """An INT4 matrix's packed uint8 rows and uint16 (fp16 bits) scale rows on the device."""
        return Int4Matrix(self._to_device(packed), self._to_device(scales), self.int4_group)

    def _free_buffers(self) -> int:
        """Free every device allocation now (not at garbage collection); returns the bytes freed."""
        freed = 0
        for graph in self._graphs.values():
            graph.close()
        self._graphs.clear()
        with self.device.bound():
            for arr in self._buffers:
                freed += arr.nbytes
                arr.gpudata.free()
        self._buffers.clear()
        return freed

    def _allocate_state(self) -> None:
        sp, m, cap = self.spec, self.max_rows, self.capacity
        kv = (sp.num_layers, sp.num_kv_heads, cap, sp.head_dim)
        rows = self._stream_rows()
        self.k_cache = self._alloc(kv, self.kv_element)
        self.v_cache = self._alloc(kv, self.kv_element)
        self._layer_stride = sp.num_kv_heads * cap * sp.head_dim * self.kv_element.itemsize   # bytes per layer
        self.resid = self._alloc((rows, sp.hidden_size), np.float32)                  # residual stream
        self.normed = self._alloc((rows, sp.hidden_size), np.float32)                 # norm outputs
        self.prefill_last = self._alloc((1, sp.hidden_size), np.float32)              # last prefill row, final layer
        self.qkv = self._alloc((rows, sp.q_dim + 2 * sp.kv_dim), np.float32)
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
        self.kv_staging = self._alloc((2, sp.num_layers, m, sp.kv_dim), self.kv_element)
        if self._persistent_capable():
            self.decode_layer_table = self._to_device(self._layer_pointers())
            self.decode_counters = self._alloc((2,), np.uint32)                      # zero: the barrier's start
        self.kv_slots_buf = self._alloc((cap,), np.int32)                             # slot lists of KV moves
        # The whole-state moves' slot lists go up from page-locked memory (cuda_kv_transfer._put_slot_list says
        # why); the event says when the last upload has read it.
        self.kv_slots_host = self._drv.pagelocked_empty(cap, np.int32)
        self.kv_slots_host_read = self._drv.Event(self._drv.event_flags.DISABLE_TIMING)
        self.kv_slots_host_read.record(self.stream)
        self.last_slot_upload_ms: float | None = None                                 # the latest upload's queuing
        self._rows_views: dict = {}               # device address -> GPUArray view (cuda_kv_transfer._rows_view)
        if self.bulk_min_rows:
            for name, (shape, dtype) in self._bulk_plan().items():
                setattr(self, name, self._alloc(shape, dtype, zero=name == "bulk_stage"))
        self._token_ids = self.ctl[ck.CTL_TOKEN:ck.CTL_TOKEN + 1]                     # decode input id (view)
        self._scale = float(sp.head_dim ** -0.5)

    def _layer_pointers(self) -> np.ndarray:
        """decode_persistent.cu's layer table: per layer, DecodeLayer's pointers in its order."""
        table = np.zeros((self.spec.num_layers, ck.DECODE_LAYER_POINTERS), np.uint64)
        for li, layer in enumerate(self.layers):
            k_ptr, v_ptr = self._kv_ptrs(li)
            table[li] = [ck.ptr(layer.w_qkv_rope), ck.ptr(layer.b_qkv), ck.ptr(layer.input_norm), ck.ptr(layer.w_o),
                         ck.ptr(layer.w_gate_up), ck.ptr(layer.post_norm), ck.ptr(layer.w_down), k_ptr, v_ptr]
        return table
