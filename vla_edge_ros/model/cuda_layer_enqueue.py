"""What a CudaBackend puts on its stream for one pass of rows: the decoder layers by pipeline (the bf16 decode
pipeline of fused one-row kernels, the split prefill pipeline, the bulk prefill's GEMMs and flash attention, the
persistent decode step), the head and the restricted argmax. A base class of cuda_backend.CudaBackend, which
captures these into CUDA graphs; nothing here synchronizes."""
from __future__ import annotations

import numpy as np

from . import cuda_kernels as ck
from .cuda_attention_launchers import long_context_splits
from .cuda_projection_launchers import STAGED_MAX_TOKENS, RopeTarget
from .cuda_int4_launchers import STAGED_INT4_MAX_TOKENS, Int4Matrix
from .cuda_bulk_launchers import FLASH_ROWS
from .cuda_device_memory import BULK_PARTIAL_ROWS, LayerWeights

# Calls of at most this many rows take the decode pipeline: bf16 one-row projections from gemv.cu
# (RMSNorm prologue, RoPE + K/V store, SwiGLU and residual adds in the epilogues: 6 launches per
# layer with the attention) and attention_decode.cu. Longer calls (prefill) take one kernel per step
# with projection_staged.cu / projection_bf16.cu and attention_mma.cu / attention_tiled.cu. Chosen by measurement (notes/cuda_notes.md, issue 10 runs 2-7):
# on one row the CUDA-core GEMV streamed weights ~1.4x faster than a tensor-core one-row projection
# (projection_fused.cu, since removed),
# and the register attention beats the shared-memory kernels; on 32 rows that attention loses 3x.
DECODE_MAX_ROWS = 1
# The kernel groups _enqueue_layers can launch apart (bench/kernel_lab.py times them one by one).
LAYER_GROUPS = ("projections", "attention", "norms+rope")


class LayerEnqueue:
    """Kernel sequences of a CudaBackend's passes (see the module docstring)."""

    def _fused(self, n: int) -> bool:
        """Whether a pass of n rows takes the decode pipeline: one row of bf16 or INT4 projections."""
        return self._decode_pipeline() and n <= DECODE_MAX_ROWS

    def _enqueue_layers(self, n: int, layer_outs: list | None = None, groups=LAYER_GROUPS,
                        layers: tuple | None = None) -> None:
        """All decoder layers (or layers [first, end) of `layers`: a piece of a layered forward) over rows [0, n)
        of resid; row offsets and lengths come from ctl. `groups` limits the launches to some of LAYER_GROUPS (the
        benchmark times them apart)."""
        first, end = (0, len(self.layers)) if layers is None else layers
        for li in range(first, end):
            layer = self.layers[li]
            if self._fused(n):
                self._enqueue_layer_fused(li, layer, n, groups)
            else:
                self._enqueue_layer_split(li, layer, n, groups)
            if layer_outs is not None:
                layer_outs.append(self._get(self.resid, n))

    def _enqueue_layer_fused(self, li: int, layer: LayerWeights, n: int, groups) -> None:
        """bf16 or INT4 decode (one row, gemv.cu / gemv_int4.cu, by the weights' type): RMSNorm folded into the
        q|k|v and gate/up projections, RoPE and the K/V store in the q|k|v epilogue, SwiGLU in the gate/up one,
        residual adds in the o/down ones."""
        sp, s, plan = self.spec, self.stream, self.kernel_plan
        # The INT4 grid choices (off by default, measured slower) go to INT4 weights only: gemv.cu takes neither.
        int4_grid = dict(items_per_block=plan.int4_gemv_items_per_block, rows_per_warp=plan.int4_gemv_rows_per_warp,
                         lean=plan.int4_decode_lean_loop)

        def gemv(W, *args, **kw):
            self.kernels.gemv(W, *args, blocks_per_sm=plan.decode_gemv_blocks_per_sm,
                              **(int4_grid if isinstance(W, Int4Matrix) else {}), **kw)
        if "projections" in groups:
            gemv(layer.w_qkv_rope, self.resid, self.qkv, ck.MODE_QKV_ROPE, s, norm_w=layer.input_norm,
                 eps=sp.rms_norm_eps, bias=layer.b_qkv, rope=self._rope_target(li))
        if "attention" in groups:
            self._enqueue_attention(li, n)
        if "projections" in groups:
            gemv(layer.w_o, self.attn, self.resid, ck.MODE_ADD, s)
            gemv(layer.w_gate_up, self.resid, self.act, ck.MODE_SWIGLU, s, norm_w=layer.post_norm,
                 eps=sp.rms_norm_eps, out_cols=sp.intermediate_size)
            gemv(layer.w_down, self.act, self.resid, ck.MODE_ADD, s)

    def _enqueue_layer_split(self, li: int, layer: LayerWeights, n: int, groups) -> None:
        """One kernel per step: RMSNorm (+ bias init), q|k|v, RoPE + K/V store, attention, o, RMSNorm,
        gate/up + SwiGLU, down (prefill, and every call of the fp32 path)."""
        sp, kn, s = self.spec, self.kernels, self.stream
        k_ptr, v_ptr = self._kv_ptrs(li)
        proj, other = "projections" in groups, "norms+rope" in groups
        if other:
            kn.rmsnorm(self.resid, layer.input_norm, self.normed, n, sp.rms_norm_eps, s, init_dst=self.qkv,
                       init_src=layer.b_qkv)
        if proj:
            self._project(layer.w_qkv, self.normed, self.qkv, n, ck.MODE_ADD)
        if other:
            kn.rope_store(self.qkv, self.pos_table, self.slot_table, self.ctl, self.inv_freq, k_ptr, v_ptr, n,
                          sp.num_heads, sp.num_kv_heads, sp.head_dim, self.capacity, s)
        if "attention" in groups:
            self._enqueue_attention(li, n)
        if proj:
            self._project(layer.w_o, self.attn, self.resid, n, ck.MODE_ADD)
        if other:
            kn.rmsnorm(self.resid, layer.post_norm, self.normed, n, sp.rms_norm_eps, s)
        if proj:
            self._project(layer.w_gate_up, self.normed, self.act, n, ck.MODE_SWIGLU, out_cols=sp.intermediate_size)
            self._project(layer.w_down, self.act, self.resid, n, ck.MODE_ADD)

    def _enqueue_bulk_layers(self, n: int, layer_outs: list | None = None, layers: tuple | None = None) -> None:
        """All decoder layers over rows [0, n) of resid through the bulk prefill (n <= bulk_max_rows; offsets and
        lengths from ctl): per layer RMSNorm -> bf16 hi/lo, q|k|v GEMM onto the bias, RoPE + K/V store, K/V of the
        attend list staged, flash attention -> hi/lo, o GEMM into the residual, RMSNorm -> hi/lo, gate/up GEMM
        with SwiGLU -> hi/lo, down GEMM into the residual. layers: (first, end), a piece of a layered forward."""
        sp, kn, s, plan = self.spec, self.kernels, self.stream, self.kernel_plan
        x_stride = self.bulk_x.size // 2                  # element offset of the lo parts
        act_stride = self.bulk_act.size // 2
        splits = self._bulk_splits(n)

        def gemm(W, x, part_stride, mode, **kw):
            kn.gemm_bulk(W, x, part_stride, n, mode, s, parts=plan.bulk_activation_parts, kernel=plan.bulk_gemm, **kw)
        first, end = (0, len(self.layers)) if layers is None else layers
        for li in range(first, end):
            layer = self.layers[li]
            k_ptr, v_ptr = self._kv_ptrs(li)
            kn.rmsnorm_split(self.resid, layer.input_norm, self.bulk_x, x_stride, n, sp.rms_norm_eps, s,
                             init_dst=self.qkv, init_src=layer.b_qkv)
            gemm(layer.w_qkv, self.bulk_x, x_stride, ck.MODE_ADD, out=self.qkv)
            kn.rope_store(self.qkv, self.pos_table, self.slot_table, self.ctl, self.inv_freq, k_ptr, v_ptr, n,
                          sp.num_heads, sp.num_kv_heads, sp.head_dim, self.capacity, s)
            kn.kv_stage(k_ptr, v_ptr, self.attend_list, self.ctl, self.bulk_stage, n, sp.num_kv_heads, self.capacity,
                        sp.head_dim, s)
            kn.attention_flash(self.qkv, self.bulk_stage, self.ctl, self.bulk_part_o, self.bulk_part_ml, self.bulk_x,
                               x_stride, n, sp.num_heads, sp.num_kv_heads, sp.head_dim, splits, self._scale, s,
                               stages=plan.bulk_attention_stages if plan.bulk_activation_parts == 2 else 1,
                               parts=plan.bulk_activation_parts, heads_per_warp=plan.bulk_attention_heads_per_warp,
                               kv_overlap=plan.bulk_attention_kv_overlap,
                               hoisted_copies=plan.bulk_attention_hoisted_copies,
                               tile_entries=plan.bulk_attention_tile_entries)
            gemm(layer.w_o, self.bulk_x, x_stride, ck.MODE_ADD, out=self.resid)
            kn.rmsnorm_split(self.resid, layer.post_norm, self.bulk_x, x_stride, n, sp.rms_norm_eps, s)
            gemm(layer.w_gate_up, self.bulk_x, x_stride, ck.MODE_SWIGLU, out_hl=self.bulk_act,
                 out_part_stride=act_stride, out_cols=sp.intermediate_size)
            gemm(layer.w_down, self.bulk_act, act_stride, ck.MODE_ADD, out=self.resid)
            if layer_outs is not None:
                layer_outs.append(self._get(self.resid, n))

    def _bulk_splits(self, n: int) -> int:
        """Blocks the attention list of a bulk pass is split over per (16 rows, KV head): enough for ~2 blocks per SM
        when the rows alone give fewer, as many as the partial-sum buffers hold."""
        blocks = ck.ceil_div(n, FLASH_ROWS) * self.spec.num_kv_heads
        return max(1, min(ck.ceil_div(2 * self.kernels.num_sms, blocks), BULK_PARTIAL_ROWS * self.bulk_max_rows // n))

    def _project(self, W, x, out, n: int, mode: int, **kw) -> None:
        """A projection of the split pipeline: projection_staged.cu where the kernel plan asks for it (bf16, up to
        32 rows; the measured-best plan does), projection_int4_staged.cu where it asks for that (INT4, up to 32
        rows; the measured-best plan does), else projection_bf16.cu / projection_f32.cu / projection_int4.cu (INT4
        with the plan's int4_prefill_lean_loop: its lean entries, as the staged kernel's)."""
        if self.kernel_plan.staged_prefill_projections and W.dtype == np.uint16 and n <= STAGED_MAX_TOKENS:
            self.kernels.projection_staged(W, x, out, n, mode, self.stream, **kw)
        elif (self.kernel_plan.staged_int4_prefill_projections and isinstance(W, Int4Matrix)
              and n <= STAGED_INT4_MAX_TOKENS):
            self.kernels.projection_int4_staged(W, x, out, n, mode, self.stream,
                                                parts=self.kernel_plan.int4_prefill_activation_parts,
                                                prefetch=self.kernel_plan.int4_prefill_activation_prefetch,
                                                lean=self.kernel_plan.int4_prefill_lean_loop, **kw)
        elif isinstance(W, Int4Matrix):
            self.kernels.projection(W, x, out, n, mode, self.stream, lean=self.kernel_plan.int4_prefill_lean_loop, **kw)
        else:
            self.kernels.projection(W, x, out, n, mode, self.stream, **kw)

    def _enqueue_attention(self, li: int, n: int) -> None:
        """attention_decode.cu (partial sums from registers) for decode rows, attention_tiled.cu (K/V chunk
        in shared memory, shared by up to 8 rows) or attention_mma.cu (the same on the tensor cores, where the
        kernel plan asks for it) for longer calls, and for decode rows too with the plan's
        decode_attention_tensor_cores; attention.cu's merge after any of them. The decode and
        tensor-core kernels launch at most cuda_kernels.long_context_splits splits, each walking as many chunks
        as the context needs (attention_tiled.cu: one chunk per split)."""
        sp, plan = self.spec, self.kernel_plan
        k_ptr, v_ptr = self._kv_ptrs(li)
        splits = long_context_splits(self.kernels.num_sms, sp.num_kv_heads, plan.long_context_blocks_per_sm,
                                     plan.long_context_min_splits_per_kv_head)
        if n <= DECODE_MAX_ROWS and not plan.decode_attention_tensor_cores:
            self.kernels.attention_decode(self.qkv, k_ptr, v_ptr, self.attend_list, self.ctl, self.part_o,
                                          self.part_ml, self.attn, n, sp.num_heads, sp.num_kv_heads, sp.head_dim,
                                          self.capacity, self.n_splits, self._scale, self.stream,
                                          head_split=plan.decode_attention_head_split, max_splits=splits,
                                          one_head=plan.decode_attention_one_head_entry,
                                          prefetch=plan.decode_attention_prefetch,
                                          exact_group=plan.decode_attention_exact_group)
            return
        self.kernels.attention(self.qkv, k_ptr, v_ptr, self.attend_list, self.ctl, self.part_o, self.part_ml, self.attn,
                               n, sp.num_heads, sp.num_kv_heads, sp.head_dim, self.capacity, self.n_splits,
                               self._scale, self.stream, tensor_cores=plan.tensor_core_attention,
                               blocks_per_sm=plan.attention_blocks_per_sm,
                               max_splits=splits if plan.tensor_core_attention else None,
                               masked_softmax=plan.attention_masked_softmax,
                               head_halves=plan.attention_head_halves)

    def _rope_target(self, li: int) -> RopeTarget:
        sp = self.spec
        k_ptr, v_ptr = self._kv_ptrs(li)
        return RopeTarget(self.pos_table, self.slot_table, self.ctl, self.inv_freq, k_ptr, v_ptr,
                             sp.num_heads, sp.num_kv_heads, sp.head_dim, self.capacity)

    def _enqueue_head_argmax(self, row: int, bin_lo: int, n_bins: int, rows_consumed: int) -> None:
        sp, kn, s = self.spec, self.kernels, self.stream
        if self.dtype == "bfloat16":            # final RMSNorm folded into the head projection (bf16 head)
            kn.gemv(self.head, self.resid, self.logits, ck.MODE_STORE, s, norm_w=self.final_norm, eps=sp.rms_norm_eps,
                    w_row0=bin_lo, rows=n_bins, x_row0=row)
        else:
            kn.rmsnorm(self.resid, self.final_norm, self.normed, 1, sp.rms_norm_eps, s, row0=row)
            kn.projection(self.head, self.normed, self.logits, 1, ck.MODE_STORE, s, w_row0=bin_lo, rows=n_bins, x_row0=row)
        kn.argmax_bins(self.logits, n_bins, bin_lo, self.ctl, self.tokens_out, rows_consumed, s)

    def _enqueue_prefill(self, n_rows: int, bin_lo: int, n_bins: int) -> None:
        self._enqueue_layers(n_rows)
        self._enqueue_head_argmax(n_rows - 1, bin_lo, n_bins, n_rows)
        # Keep the last row's final hidden state: decode reuses resid, prefill_logits() reads this. The copy
        # comes last so that no programmatically launched kernel follows a copy node in the graph.
        row_bytes = self.spec.hidden_size * 4
        self._drv.memcpy_dtod_async(int(self.prefill_last.gpudata), int(self.resid.gpudata) + (n_rows - 1) * row_bytes,
                                    row_bytes, self.stream)

    def _enqueue_decode(self, bin_lo: int, n_bins: int) -> None:
        self.kernels.embed_gather(self.embed_table, self._token_ids, self.resid, 1, self.stream)
        if self.kernel_plan.persistent_decode:
            self._enqueue_persistent_layers()
        else:
            self._enqueue_layers(1)
        self._enqueue_head_argmax(0, bin_lo, n_bins, 1)

    def _enqueue_persistent_layers(self) -> None:
        """Every layer of the decode step in one cooperative launch of decode_persistent.cu."""
        sp, plan = self.spec, self.kernel_plan
        self.kernels.decode_layers(
            self.decode_layer_table, self.resid, self.qkv, self.attn, self.act, self.part_o, self.part_ml,
            self.attend_list, self.pos_table, self.slot_table, self.ctl, self.inv_freq, self.decode_counters,
            qkv_rows=self.layers[0].w_qkv_rope.shape[0], inter=sp.intermediate_size,
            gate_up_rows=self.layers[0].w_gate_up.shape[0], n_q_heads=sp.num_heads, n_kv_heads=sp.num_kv_heads,
            head_dim=sp.head_dim, capacity=self.capacity, n_splits=self.n_splits, eps=sp.rms_norm_eps,
            scale=self._scale, stream=self.stream, blocks_per_sm=plan.persistent_blocks_per_sm,
            l2_prefetch_bytes=plan.persistent_l2_prefetch_bytes)
