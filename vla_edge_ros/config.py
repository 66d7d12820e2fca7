"""One typed configuration for the whole package.

Every constant the engine, the nodes and the benchmarks use lives in one of the
frozen dataclasses below. Values come from ``config/vla_edge.yaml`` (the same
file the ROS launch passes as ``ros__parameters``), so a number is written in
exactly one place. Loading is strict: an unknown key, a value of the wrong type
or an impossible value raises :class:`ConfigError` naming the dotted key.

This module imports neither rclpy nor numpy: nodes, tools and tests can all
read the configuration cheaply.
"""
from __future__ import annotations

import dataclasses
import math
import os
import re
import typing
from dataclasses import dataclass, field
from pathlib import Path

import yaml

EVICTION_POLICIES = ("fifo", "sliding_window", "semantic")
BACKENDS = ("auto", "numpy", "pycuda")
DTYPES = ("float32", "bfloat16")
# model.weights: how the snapshot stores its projection matrices (float: F32/BF16; int4: model/int4.py's format).
WEIGHT_FORMATS = ("float", "int4")
BULK_PRECISIONS = ("split", "bf16")   # model.bulk_prefill_precision: activation parts 2 or 1
INT4_BITS = 4                 # bits of one quantized weight: two per byte
INT4_SCALE_BYTES = 2          # one fp16 scale per group
# kv.dtype -> bytes one K or V value takes in the arena (the numpy backend reports its memory with it).
KV_ELEMENT_BYTES = {"float32": 4, "bfloat16": 2}
KV_DTYPES = tuple(KV_ELEMENT_BYTES)
# Keys the robot's configuration had and no longer has: kernel choices that only the bench varies. The serving backend
# runs the measured-best KernelPlan; a file or parameter still setting one gets this reason instead of "unknown key",
# so that whoever turned the knob learns where the choice went.
_CYCLE_BENCH = "python -m vla_edge_ros.bench.pycuda_cycle --launch-modes "
_REMOVED_KERNEL_KEYS = {    # KernelPlan field -> the bench command that times its alternative
    "programmatic_launch": _CYCLE_BENCH + "pdl",
    "persistent_decode": _CYCLE_BENCH + "persistent",
    "staged_prefill_projections": "python -m vla_edge_ros.bench.decode_profile --unstaged-prefill",
    "tensor_core_attention": _CYCLE_BENCH + "plain+tiled",
    "decode_attention_head_split": _CYCLE_BENCH + "plain+h1",
    "decode_gemv_blocks_per_sm": _CYCLE_BENCH + "plain+noloop",
}
REMOVED_KEYS = {f"model.{field}": (f"no longer a robot setting: the pycuda backend runs the measured-best kernel plan "
                                   f"(vla_edge_ros/model/cuda_kernel_plan.py, KernelPlan.{field}); the bench times "
                                   f"the alternatives (plans from vla_edge_ros/bench/kernel_lab.py: {how}). Remove "
                                   f"the key")
                for field, how in _REMOVED_KERNEL_KEYS.items()}
RELIABILITIES = ("best_effort", "reliable")
# A TF frame name as tf2 and every ROS tool read header.frame_id: names of letters, digits and '_',
# optionally namespaced with '/', no leading '/' (tf2 refuses it), no spaces or protocol marks.
TF_FRAME_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(/[A-Za-z_][A-Za-z0-9_]*)*")
ASR_MODES = ("csr", "semantic")
ASR_SCHEDULES = ("auto", "slack", "free")
SWAP_FINISHES = ("boundary", "next_cycle")
SEMANTIC_TRIGGERS = ("evictions", "fill")
EXECUTORS = ("events", "single_threaded")
MIN_EXPORT_BUFFERS = 3        # asr.export_buffers: the newest offer, the one being copied, one to export into
TAIL_MIN_SAMPLES = 10         # a tail quantile needs this many samples (core/sample_window.py; before: the mean alone)
# An instruction is cut to its last prompt.max_suffix_tokens x this many characters before it is tokenized: far more
# than those tokens take in any text (a token is a few characters), so the tokens kept are the same, and the cycle
# thread never tokenizes megabytes (a 2.2 MB /vla/instruction cost 39 boundaries, ~2 s without actions).
INSTRUCTION_CHARS_PER_TOKEN = 32
ACTION_TOKEN = "<|act_{}|>"   # the name of action bin i in a tokenizer made for this package (model/make_model.py)
GIB = 1024 ** 3


class ConfigError(ValueError):
    """A configuration value is missing, unknown, mistyped or impossible."""


def _doc(text: str, **kw):
    """A dataclass field carrying its own description (used for ROS parameter descriptors)."""
    return field(metadata={"doc": text}, **kw)


# ----------------------------------------------------------------------------
# Sections


@dataclass(frozen=True)
class CycleConfig:
    deadline_ms: float = _doc("control-cycle deadline; an action finishing later is a deadline_missed fallback", default=33.0)
    safety_margin_ms: float = _doc("kept free at the end of each cycle when deciding admission", default=2.0)
    camera_hz: float = _doc("nominal camera rate (the demo publisher's rate)", default=60.0)
    stale_frame_ms: float = _doc("a frame whose capture stamp is older than this is answered with stale_frame", default=250.0)
    deterministic: bool = _doc("never refuse for budget (offline replay, equivalence tests); deadline still reported", default=False)
    realtime_priority: int = _doc("SCHED_FIFO priority (1..99) of the reasoning node's cycle thread, where the process "
                                  "may use real-time scheduling (root, CAP_SYS_NICE, or an rtprio limit); other "
                                  "processes on the cores then cannot preempt a cycle. 0: ordinary scheduling. "
                                  "Refused by the OS: logged once, ordinary scheduling", default=10)

    gil_switch_interval_ms: float = _doc("the reasoning process's Python thread switch interval (sys.setswitchinterval): "
                                         "how long the cycle thread can wait for the interpreter lock while another "
                                         "thread of the node (the executor: frames, diagnostics; the swap loader) runs "
                                         "Python. Python's default is 5 ms, a sixth of a cycle", default=0.5)
    boundary_switch_interval_ms: float = _doc("while the cycle thread applies a reconciled state at a boundary, the "
                                              "process's switch interval is raised to this, so that a thread asking "
                                              "for the interpreter lock mid-swap waits for the swap (~1 ms) instead "
                                              "of taking the lock between its steps (core/interpreter_hold.py). 0: "
                                              "off, the interval stays gil_switch_interval_ms. Why: on the H200 the "
                                              "swap's whole-state KV scatter queued in 0.045 ms p50 in an idle "
                                              "process and in 0.19 ms p50 (0.32 p99) inside the graph (2026-12-04, "
                                              "fifteenth session). For asr.swap_finish next_cycle, whose boundary "
                                              "makes no call that gives the lock up: a boundary that waits for the "
                                              "device gives it up there and may then wait this long to get it back. "
                                              "2 in config/gpu_demo.yaml (two H200 soaks: the swap's max 1.44 and "
                                              "1.59 ms, against 1.53-2.60 without); 0 on the CPU", default=0.0)
    executor: str = _doc("the rclpy executor of every node's callbacks, chosen once when the node process starts: "
                         "events (rclpy.experimental.EventsExecutor: callbacks dispatched from C++) | "
                         "single_threaded (rclpy's SingleThreadedExecutor, which rebuilds its wait set in Python on "
                         "every wake-up). On the 2-vCPU machine py-spy --gil showed the reasoning node's executor "
                         "holding the interpreter lock 25% of the time, nearly all of it that bookkeeping, and the "
                         "cycle thread off the CPU 1.45 ms per cycle (median); the events executor: 0.51 ms",
                         default="events")

    def __post_init__(self):
        if self.executor not in EXECUTORS:
            raise ConfigError(f"cycle.executor must be one of {EXECUTORS}, got {self.executor!r}")
        if not 0.0 < self.gil_switch_interval_ms <= 10.0:
            raise ConfigError(f"cycle.gil_switch_interval_ms must be in (0, 10], got {self.gil_switch_interval_ms}")
        if not 0.0 <= self.boundary_switch_interval_ms <= 10.0:
            raise ConfigError(f"cycle.boundary_switch_interval_ms must be in [0, 10] (0: off), got "
                              f"{self.boundary_switch_interval_ms}")
        if not 0 <= self.realtime_priority <= 99:
            raise ConfigError(f"cycle.realtime_priority must be in 0..99 (0 = ordinary scheduling), got "
                              f"{self.realtime_priority}")
        _positive(self, "deadline_ms", "cycle")
        _non_negative(self, "safety_margin_ms", "cycle")
        _positive(self, "camera_hz", "cycle")
        _positive(self, "stale_frame_ms", "cycle")
        if self.safety_margin_ms >= self.deadline_ms:
            raise ConfigError(f"cycle.safety_margin_ms ({self.safety_margin_ms}) must be smaller than cycle.deadline_ms ({self.deadline_ms})")

    @property
    def period_s(self) -> float:
        return self.deadline_ms / 1000.0


@dataclass(frozen=True)
class AdmissionConfig:
    ema_alpha: float = _doc("weight of the newest measurement in the prefill and decode ms/token EMAs", default=0.2)
    probe_after_refusals: int = _doc("after this many refusals in a row, admit one cycle to re-measure the cost", default=15)
    spike_factor: float = _doc("a cycle costing more than this times the estimate is a spike (interference, e.g. the "
                               "reconciler's rebuild): it does not move the estimate, so it cannot make the next "
                               "second refuse", default=1.5)
    spikes_to_adopt: int = _doc("this many spikes in a row are a lasting change of cost, not interference: the "
                                "last of them seeds the estimate", default=5)
    tail_quantile: float = _doc("admit on this quantile of the recent cycles' actual / predicted cost, not on the "
                                "mean (core/admission.py); 0 = on the mean", default=0.95)
    tail_window: int = _doc("the tail is taken over the actual / predicted ratios learned in the last this many "
                            "cycles (refused ones counted: a ratio expires while admission refuses)", default=90)
    probe_on_context_shrink: float = _doc("a cycle refused with its state holding at most (1 - this) of the tokens "
                                          "the estimate was learned with (a swap or re-base shrank it) is admitted "
                                          "as a probe at once (core/admission.py); 0 = never", default=0.25)
    context_cost: bool = _doc("take the capacity check's measured cost per context token into every estimate, so "
                              "that a swap which grows the state (at 32K slots on the H200: 90 -> 729 frames, "
                              "~9 ms more per cycle) raises the estimate before its first cycle instead of after "
                              "a late one (core/admission.py); needs lifecycle.capacity_check_cycles > 0. On in "
                              "config/gpu_demo.yaml (measured there); off on the CPU", default=False)

    def __post_init__(self):
        if not 0.0 <= self.tail_quantile < 1.0:
            raise ConfigError(f"admission.tail_quantile must be in [0, 1), got {self.tail_quantile}")
        if self.tail_window < TAIL_MIN_SAMPLES:     # a window of fewer ratios never has a tail: admission on the mean
            raise ConfigError(f"admission.tail_window must be at least {TAIL_MIN_SAMPLES} (the ratios a tail needs), "
                              f"got {self.tail_window}; admission.tail_quantile 0 admits on the mean")
        if not 0.0 <= self.probe_on_context_shrink < 1.0:
            raise ConfigError(f"admission.probe_on_context_shrink must be in [0, 1), got {self.probe_on_context_shrink}")
        if not 0.0 < self.ema_alpha <= 1.0:
            raise ConfigError(f"admission.ema_alpha must be in (0, 1], got {self.ema_alpha}")
        _positive(self, "probe_after_refusals", "admission")
        if not self.spike_factor > 1.0:
            raise ConfigError(f"admission.spike_factor must be > 1, got {self.spike_factor}")
        _positive(self, "spikes_to_adopt", "admission")


@dataclass(frozen=True)
class VisionConfig:
    patch_size: int = _doc("square patch edge in pixels", default=16)
    grid_cols: int = _doc("patches across (image width = grid_cols * patch_size)", default=8)
    grid_rows: int = _doc("patches down (image height = grid_rows * patch_size)", default=4)
    seed: int = _doc("seed of the projection weights when no weights file is given", default=1234)
    weights_path: str = _doc("optional safetensors file with patch_proj.weight [hidden, 3*p*p] and patch_proj.bias [hidden]", default="")
    on_gpu: bool = _doc("run the reasoning node's patch projection on the model's GPU (model.backend pycuda; "
                        "cuda/vision.cu, the resize stays on the host; on in config/gpu_demo.yaml). The reconciler "
                        "keeps the numpy projection: its encodes are outside its slack schedule, and on the GPU they "
                        "time-sliced the primary's cycles (engine_factory.reconciler_encoder)", default=False)
    encode_ahead: bool = _doc("the reasoning node encodes each newest camera frame on a worker thread as it arrives, "
                              "so the cycle that takes it finds its vision tokens made (core/vision_prefetch.py; "
                              "the same encoder and bits; every frame is encoded, ~2 per cycle at 60 Hz). Meant "
                              "for the GPU graph, where the vision phase is part of what the graph spends beyond "
                              "the engine. Measured there and off: in a 3-minute H200 soak (2026-12-03, eighth "
                              "session) the graph's cycle p99 was 2.52 ms over the engine bench with it, against "
                              "1.14 ms without on the next machine; the encoding thread (0.41 ms a frame, 60 a "
                              "second) took the interpreter from the cycle thread (off-CPU p99 1.29 ms against "
                              "0.28). On a 2-core CPU machine its host time competes with the cycle too",
                              default=False)

    def __post_init__(self):
        for name in ("patch_size", "grid_cols", "grid_rows"):
            _positive(self, name, "vision")

    @property
    def tokens_per_frame(self) -> int:
        return self.grid_cols * self.grid_rows

    @property
    def image_width(self) -> int:
        return self.grid_cols * self.patch_size

    @property
    def image_height(self) -> int:
        return self.grid_rows * self.patch_size

    @property
    def patch_dim(self) -> int:
        return 3 * self.patch_size * self.patch_size


@dataclass(frozen=True)
class KVConfig:
    capacity_tokens: int = _doc("KV slots in the arena: prefix + retained frames + one cycle's suffix", default=4096)
    eviction_policy: str = _doc("fifo | sliding_window | semantic", default="semantic")
    window_frames: int = _doc("sliding_window: frames kept even when capacity remains", default=64)
    recompute_headroom: float = _doc("a RoPE re-base without a swap, and a swap's recompute of late frames, plan each "
                                     "frame they recompute at this multiple of its estimated cost (H200, 1.5B: a "
                                     "re-base of 4 frames planned without it ran a cycle 2 ms late; CPU demo: swaps "
                                     "planned without it overran the next boundary 1-4 times in 20 s)", default=1.25)
    recompute_estimate_cap: float = _doc("those plans count measured recomputes up to this x the cycles' estimate of a "
                                         "frame's prefill (2-4x on the CPU): slow samples alone must not stop every "
                                         "later swap and re-base (Engine._frame_recompute_ms)", default=8.0)
    dtype: str = _doc("float32 | bfloat16: the element type of the KV arena; bfloat16 halves the arena, the "
                      "attention's K/V bytes and every device swap. Measured on the H200 (1.5B, 4064 cached): prefill "
                      "attention 0.70 -> 0.57 ms, the cycle unchanged within noise; `vla-edge verify` on the 1.5B "
                      "shape misses the teacher-forced top-1 threshold by one token (147 of 149 against HF with its "
                      "K/V rounded alike: bf16 rounding boundaries fall apart between any two implementations), so "
                      "float32 stays the default", default="float32")

    def __post_init__(self):
        _positive(self, "capacity_tokens", "kv")
        _positive(self, "window_frames", "kv")
        for name in ("recompute_headroom", "recompute_estimate_cap"):
            if not getattr(self, name) >= 1.0:
                raise ConfigError(f"kv.{name} must be >= 1, got {getattr(self, name)}")
        if self.eviction_policy not in EVICTION_POLICIES:
            raise ConfigError(f"kv.eviction_policy must be one of {EVICTION_POLICIES}, got {self.eviction_policy!r}")
        if self.dtype not in KV_DTYPES:
            raise ConfigError(f"kv.dtype must be one of {KV_DTYPES}, got {self.dtype!r}")


@dataclass(frozen=True)
class ActionConfig:
    num_tokens: int = _doc("action tokens decoded per cycle, one per action dimension", default=8)
    num_bins: int = _doc("action bins, mapped onto the last num_bins vocabulary ids", default=256)
    dim_names: tuple = _doc("JointState names of the action dimensions", default=("joint_1", "joint_2", "joint_3", "joint_4", "joint_5", "joint_6", "joint_7", "gripper"))

    def __post_init__(self):
        _positive(self, "num_tokens", "action")
        if self.num_bins < 2:
            raise ConfigError(f"action.num_bins must be >= 2, got {self.num_bins}")
        if len(self.dim_names) != self.num_tokens:
            raise ConfigError(f"action.dim_names has {len(self.dim_names)} names but action.num_tokens is {self.num_tokens}")


@dataclass(frozen=True)
class PromptConfig:
    system_prompt: str = _doc("static prefix: computed once, never recomputed", default="You control a robot arm. Answer each camera frame with one action.")
    embodiment: str = _doc("static embodiment description appended to the prefix", default="Arm: 7 joints and a parallel gripper.")
    instruction: str = _doc("default task instruction (the /vla/instruction topic replaces it)", default="pick up the red block")
    action_prompt: str = _doc("text after the instruction that asks for the action tokens", default="Action:")
    max_suffix_tokens: int = _doc("instruction + action prompt longer than this is truncated (from the front)", default=48)

    def __post_init__(self):
        _positive(self, "max_suffix_tokens", "prompt")


@dataclass(frozen=True)
class MemoryConfig:
    vram_ceiling_gib: float = _doc("modelled device-memory ceiling of one model process (the reasoning node's engine, "
                                   "the reconciler's state; each holds its own copy of the weights and KV arena): the "
                                   "CUDA backend refuses a plan above it before allocating, the engine refuses to "
                                   "configure above it. A GPU reconciler's export buffers (asr.export_buffers) are not "
                                   "counted", default=8.0)
    sample_period_ms: float = _doc("how often the memory sampler reads usage", default=100.0)
    malloc_mmap_threshold_mib: float = _doc("each node process fixes glibc's mmap threshold at this size once built "
                                            "(core/malloc_threshold.py): buffers this large or larger go back to the "
                                            "OS when freed, where glibc's dynamic threshold let a node's resident "
                                            "memory step up by a 24 MiB swap snapshot and stay. Above a camera frame, "
                                            "below a snapshot; 0 leaves glibc's default. Read at process start",
                                            default=4.0)
    heap_trim_interval_s: float = _doc("the model nodes hand their free heap memory back to the OS (glibc "
                                       "malloc_trim, core/heap_trim.py) at most this often: the reasoning node from "
                                       "its cycle thread after a cycle's boundary work, the reconciler from its "
                                       "worker while no round runs; 0: never. Without it a burst of extra live "
                                       "buffers (a round that ran late) stays resident as free heap: +5.8 MiB in "
                                       "an H200 soak, which failed its memory-growth bound", default=10.0)
    heap_trim_min_slack_ms: float = _doc("... the reasoning node's only with at least this many ms left before the "
                                         "next cycle boundary", default=8.0)

    def __post_init__(self):
        _positive(self, "vram_ceiling_gib", "memory")
        if self.heap_trim_interval_s < 0 or self.heap_trim_min_slack_ms < 0:
            raise ConfigError(f"memory.heap_trim_interval_s and memory.heap_trim_min_slack_ms must be >= 0, got "
                              f"{self.heap_trim_interval_s} and {self.heap_trim_min_slack_ms}")
        _positive(self, "sample_period_ms", "memory")
        if not 0.0 <= self.malloc_mmap_threshold_mib <= 32.0:
            raise ConfigError(f"memory.malloc_mmap_threshold_mib must be in 0..32 (0 leaves glibc's dynamic "
                              f"threshold, which itself stops at 32), got {self.malloc_mmap_threshold_mib}")

    @property
    def vram_ceiling_bytes(self) -> int:
        return int(self.vram_ceiling_gib * GIB)


@dataclass(frozen=True)
class ModelConfig:
    path: str = _doc("HuggingFace snapshot directory (config.json, *.safetensors, tokenizer.json)", default="models/tiny")
    backend: str = _doc("auto | numpy | pycuda (auto: pycuda when a CUDA device exists)", default="auto")
    dtype: str = _doc("weight precision of the backend: float32 | bfloat16", default="float32")
    cpu_threads: int = _doc("BLAS threads of the numpy backend per process (small matrices: 1 is fastest)", default=1)
    bulk_prefill_min_rows: int = _doc("pycuda, bf16: a forward over at least this many rows (a reconciler's "
                                      "multi-frame step, a RoPE re-base, a full recompute) runs the bulk prefill: "
                                      "tensor-core GEMMs (gemm_bulk.cu) and flash attention over staged K/V "
                                      "(prefill_bulk.cu) in passes of bulk_prefill_max_rows rows, instead of the "
                                      "cycle's prefill kernels in passes of 128 rows. 0: off. Measured on the H200 "
                                      "(1.5B shape, 2048 cached): 64 rows 5.5 vs 5.3 ms, 128 rows 6.6 vs 9.3, 1024 "
                                      "rows 29.7 vs 75.0 (bulk vs cycle kernels); verify passes with it on every "
                                      "forward. 64: where the two are even, so a reconciler step's cost grows "
                                      "smoothly with its frames (its schedule estimates untried sizes from tried "
                                      "ones)", default=64)
    bulk_prefill_max_rows: int = _doc("pycuda: rows per pass of the bulk prefill; its buffers are sized for it "
                                      "(~50 KB per row on the Qwen2.5-1.5B shape)", default=1024)
    bulk_prefill_precision: str = _doc("pycuda, bf16: the operands of the bulk prefill's products. split: each "
                                       "activation, q and softmax weight as a bf16 pair hi + lo (~16 mantissa bits, the "
                                       "cycle's own precision: the KV a reconciler rebuilds is what the primary would "
                                       "compute, to ~1e-5). bf16: one bf16 operand, as HF's bf16 model and SDPA compute "
                                       "(half the tensor-core products; the rebuilt KV differs from the primary's by "
                                       "bf16 rounding, ~1e-3 relative). Measured on the H200 (2026-12-04, fifteenth "
                                       "session): bench csr's recompute 1.26-1.40x faster than the day before's split "
                                       "run (50.2 against 65.3 ms at 4K, 697 against 971 at 32K; HF 31.5 and 358), bench"
                                       " asr at 32K slots 38 refused cycles in 2400 against 296; but vla-edge verify on "
                                       "the 1.5B shape FAILS its teacher-forced top-1 bound (97.99% with every forward "
                                       "on it, 97.32% with the prompts on it and the decode split; >= 99% required), so "
                                       "split is the default", default="split")
    weights: str = _doc("float | int4: how model.path stores the seven projection matrices of every layer. int4: "
                        "symmetric INT4 in groups along the input dimension with one fp16 scale per group (model/int4.py; "
                        "`vla-edge quantize` writes such a snapshot, compressed-tensors W4A16 pack-quantized ones are "
                        "read too); the numpy backend computes with the dequantized values in float32. The snapshot's "
                        "config.json says which it holds and a mismatch is refused", default="float")
    int4_group_size: int = _doc("weights per fp16 scale, along a projection's input dimension, that `vla-edge quantize` "
                                "and `make-model --weights int4` write (4.125 bits per weight at 128, as Kshipra). "
                                "It must divide every projection's input dimension: 128 does for Qwen2.5-1.5B and "
                                "Llama-2-7B; tiny (352) takes 32, SmolLM2-135M (576) 64. Readers take the group size "
                                "the snapshot states", default=128)

    def kernel_options(self) -> dict:
        """The pycuda backend's settings a robot chooses, as CudaBackend's keyword arguments (its kernels are the
        measured-best KernelPlan: REMOVED_KEYS)."""
        return {"bulk_prefill_min_rows": self.bulk_prefill_min_rows,
                "bulk_prefill_max_rows": self.bulk_prefill_max_rows,
                "bulk_prefill_precision": self.bulk_prefill_precision}

    def __post_init__(self):
        if self.backend not in BACKENDS:
            raise ConfigError(f"model.backend must be one of {BACKENDS}, got {self.backend!r}")
        if not self.path:
            raise ConfigError("model.path must name a model directory")
        _positive(self, "cpu_threads", "model")
        if self.dtype not in DTYPES:
            raise ConfigError(f"model.dtype must be one of {DTYPES}, got {self.dtype!r}")
        _non_negative(self, "bulk_prefill_min_rows", "model")
        _positive(self, "bulk_prefill_max_rows", "model")
        if self.bulk_prefill_precision not in BULK_PRECISIONS:
            raise ConfigError(f"model.bulk_prefill_precision must be one of {BULK_PRECISIONS}, got "
                              f"{self.bulk_prefill_precision!r}")
        if self.weights not in WEIGHT_FORMATS:
            raise ConfigError(f"model.weights must be one of {WEIGHT_FORMATS}, got {self.weights!r}")
        # Two weights share a byte, so a group must hold whole bytes.
        if self.int4_group_size <= 0 or self.int4_group_size % 2:
            raise ConfigError(f"model.int4_group_size must be a positive even number, got {self.int4_group_size}")


@dataclass(frozen=True)
class CameraConfig:
    input_topic: str = _doc("camera topic read by camera_ingest", default="/camera/image_raw")
    compressed: bool = _doc("subscribe to sensor_msgs/CompressedImage instead of Image", default=False)
    reliability: str = _doc("best_effort | reliable (best_effort matches both kinds of publisher)", default="best_effort")
    max_pixels: int = _doc("larger images are rejected as absurd", default=4096 * 4096)
    frame_id: str = _doc("TF frame of the camera: header.frame_id of every frame, state chunk and action-tokens "
                         "message the graph publishes (nothing else travels in frame_id)", default="camera")

    def __post_init__(self):
        if self.reliability not in RELIABILITIES:
            raise ConfigError(f"camera.reliability must be one of {RELIABILITIES}, got {self.reliability!r}")
        if not TF_FRAME_NAME.fullmatch(self.frame_id):
            raise ConfigError(f"camera.frame_id must be a TF frame name (letters, digits, '_', '/' between names, "
                              f"no leading '/'), got {self.frame_id!r}")
        _positive(self, "max_pixels", "camera")


@dataclass(frozen=True)
class ASRConfig:
    mode: str = _doc("csr: drop the oldest chunks at the threshold; semantic: rebuild the frames the eviction policy "
                     "keeps (asr.semantic_trigger says when)", default="csr")
    threshold: float = _doc("fill fraction of the state that triggers reconciliation (csr mode, and semantic mode "
                            "with asr.semantic_trigger fill)", default=0.9)
    evict_fraction: float = _doc("fraction of the oldest chunks dropped per reconciliation (csr mode)", default=0.5)
    semantic_evictions_before_rebuild: int = _doc("approximate evictions that trigger an exact rebuild (semantic mode)", default=8)
    semantic_trigger: str = _doc("semantic mode: what starts a round. evictions: asr.semantic_evictions_before_rebuild "
                                 "approximate evictions by the primary, which serves on an approximate state from the "
                                 "first of them until the swap. fill: "
                                 "the primary's frames reach asr.threshold of the frame capacity, as in csr mode, so a "
                                 "round that keeps up swaps before the primary evicts on its own; asr.rebuild_fill "
                                 "must then be below asr.threshold. 30 s CPU demos (config/cpu_demo.yaml, notes/cpu_notes.md): "
                                 "21.7% of actions exact with evictions, 98.7% with fill and rebuild_fill 0.5; not "
                                 "measured on the GPU, hence evictions by default", default="evictions")
    rebuild_fill: float = _doc("semantic mode: the rebuilt state keeps at most this fraction of the frame capacity "
                               "(the eviction policy drops the primary's most redundant frames beyond it), so chunks "
                               "arriving while the reconciler works fit without new approximate evictions", default=0.75)
    round_fit_margin: float = _doc("a round keeps at most this fraction of the frames that it can rebuild and catch up "
                                   "within the reconciler's frame capacity at the measured arrival and rebuild rates "
                                   "(core/round_budget.py: n <= margin x capacity x (1 - arrivals/rebuilds)), fewer "
                                   "than asr.mode's rule when that rule's round would outgrow the arena and be "
                                   "aborted (semantic mode on the H200 with rebuild_fill 0.75: 128 of 153 rounds). "
                                   "The rest is room for the frames arriving between the offer and the swap",
                                   default=0.8)
    warmup_tokens_per_step: int = _doc("the largest reconciler step (warm-up and catch-up): tokens of one forward, "
                                       "whole frames, at least one. The cap, not the plan: on the slack schedule "
                                       "core/slack_scheduler.py picks the largest step whose measured (or "
                                       "conservatively estimated) cost fits the gap before the primary's next "
                                       "cycle; on the free schedule every step is this size. The reconciler's "
                                       "backend prepares forward() for every step size up to it at configure (CUDA: "
                                       "captures their graphs), so no step pays a capture inside a gap", default=128)
    max_late_chunks: int = _doc("the most frames the primary recomputes when it applies a reconciled state at a "
                                "cycle boundary (asr.late_frames_per_forward at a time): the frames it admitted "
                                "after the snapshot (late) and any the reconciler never saw. An offer with more late frames is not "
                                "applied but deferred (the reconciler keeps catching up and offers a fresher "
                                "version); never-seen frames beyond it are forgotten, oldest first", default=2)
    late_frames_per_forward: int = _doc("frames of a swap's recompute at the boundary per forward, each batch size up "
                                        "to max_late_chunks prepared in warm-up. 1: the shape of the re-base step, "
                                        "one forward per frame; 2 (the default): a swap's two late frames in one "
                                        "forward, fewer launches and less device time. The late recompute's p99 at "
                                        "a swap: on the H200 (4-minute soaks, 2026-12-04) 1.23 ms against 1.43-1.46 "
                                        "with 1; on a 2-core CPU (tiny model, 20 s demos, 2026-12-02) 3.0-3.6 ms "
                                        "against 4.4 (notes/cuda_notes.md, notes/cpu_notes.md)", default=2)
    swap_finish: str = _doc("where a swap's device work ends. boundary: at the boundary itself, which waits for the "
                            "snapshot's KV copy (and checks it was not torn) and recomputes the late frames. "
                            "next_cycle: the boundary only queues the copy and admits the late frames' slots; the "
                            "next cycle, at its start and before its admission decision, checks the copy and writes "
                            "the late frames (the same forwards), so the boundary is host bookkeeping only. As many "
                            "late frames go to the next cycle as its planned cost leaves room for (the rest are "
                            "recomputed at the boundary). A copy found torn empties the state (exact) before "
                            "anything reads it. boundary by default (notes/cuda_notes.md, 2026-12-04 twelfth)",
                            default="boundary")
    swap_poll_ms: float = _doc("how often the reasoning node asks the reconciler for a fresher state (a service call; "
                               "none while one is loading or waiting for its boundary). Every ms of the wait is a late "
                               "frame sooner: polled every 100 ms, offers waited 1.5 cycles on average before they "
                               "were even asked for, and 28 of 83 in a 4-minute H200 soak arrived with more than "
                               "max_late_chunks late frames and were deferred; at 10 ms (config/gpu_demo.yaml), with "
                               "the reconciler's encoding moved off its worker, 140 of 148 rounds were applied. Each "
                               "request costs both processes CPU: on a 2-core machine polling every 10 or 33 ms took "
                               "cycles from the primary (79 and 30 refusals in one 40 s demo each, against 1), hence "
                               "100 ms by default", default=100.0)
    snapshot_rows: bool = _doc("offers carry their frames' vision rows (the reasoning node needs them to recompute "
                               "those frames later: late frames at a swap, a RoPE re-base). false: they are left out "
                               "and the reasoning node takes them from the frames it admitted itself, kept for "
                               "frame_capacity frames after it lets them go; an offer of the 1.5B shape at 4096 slots "
                               "then writes and reads ~1 MB instead of ~25 MB through /dev/shm. Off by default since "
                               "two 3-minute H200 soaks side by side (notes/cuda_notes.md, 2026-12-02 second): with "
                               "the rows 35 of 90 rounds applied and 18% of actions on an exact state, without them "
                               "114 of 115 and 100%", default=False)
    export_buffers: int = _doc("reconciler on a GPU: device buffers its offers' KV is exported into (each the size of "
                               "the KV arena). At least 3: the newest offer, the one the primary may be copying "
                               "from (the latest answered), and one to export the next fresher offer into, so a "
                               "re-export never overwrites KV the primary may be reading", default=3)
    step_layer_pieces: int = _doc("reconciler on the slack schedule: a step may run its forward in up to this many "
                                  "pieces of consecutive layers, one gap after another (core/gap_steps.py), when a "
                                  "step of more frames fits that way than whole in the gap: at 32768 slots on the "
                                  "H200 a one-frame step took 5.7 ms of ~6 ms gaps and an eight-frame one 12.3 ms, "
                                  "so rounds caught up no faster than frames arrived. 1: whole steps only. Off until "
                                  "measured on the GPU", default=1)
    host_generation_board: bool = _doc("reconciler on a GPU: its export buffers' generation words are also kept in a "
                                       "small shared-memory file that the reasoning node maps, so a swap's check at "
                                       "the boundary that its offer is still current reads host memory instead of "
                                       "the device (a synchronous read: most of the swap's 0.2-0.6 ms of checks in "
                                       "the H200 soaks). The copy's own device reads still prove it untorn. Off "
                                       "until measured on the GPU (model/generation_board.py)", default=False)
    backend: str = _doc("the reconciler node's transformer backend (auto | numpy | pycuda). pycuda runs it in a CUDA "
                        "context of its own process (pick the GPU with CUDA_VISIBLE_DEVICES); on the primary's GPU its "
                        "kernels time-slice with the cycles (hence asr.schedule slack). numpy by default, the CPU "
                        "machine's; config/gpu_demo.yaml sets pycuda, the arrangement the H200 soaks measured",
                        default="numpy")
    device: int = _doc("the CUDA device of a GPU reconciler (asr.backend pycuda or auto; numbered as the process sees "
                       "them, after CUDA_VISIBLE_DEVICES). -1: the primary's device (device 0), the one-GPU "
                       "arrangement. Another index puts the reconciler on a second GPU, the CSR/ASR paper's own "
                       "arrangement: its offers' KV is read by the primary's GPU peer to peer (CUDA IPC opened with "
                       "peer access). An index the process cannot see fails the reconciler's configure; one the "
                       "primary's GPU cannot reach peer to peer is reported at configure and the reconciler runs on "
                       "the primary's device instead (model/cuda_device.reconciler_device_index). Not yet measured "
                       "on two GPUs", default=-1)

    schedule: str = _doc("slack: the reconciler's work runs only between the end of a primary cycle and the next "
                         "boundary (core/slack_scheduler.py; the reasoning node publishes its cycle timing, "
                         "core/cycle_clock.py); free: it runs whenever it has work; auto: slack when the reconciler "
                         "is on a GPU (it shares the primary's), free on the CPU (other cores do the work)",
                         default="auto")
    slack_margin_ms: float = _doc("slack schedule: kept free before the primary's next boundary", default=2.0)
    step_cost_follows_context: bool = _doc("slack schedule: plan each step at the cost of its size moved to the "
                                           "context it starts with (core/step_costs.py): a round grows the "
                                           "reconciler's state, and a size's earlier samples understate its later "
                                           "steps (at 32K slots on the H200 every other cycle of a catch-up "
                                           "started 2-3.5 ms late with ~600 frames held). Off: one GPU run with "
                                           "it, no clear change",
                                           default=False)
    niceness: int = _doc("the reconciler process's CPU niceness (Linux nice value 0..19, applied to all its threads at "
                         "configure): where the cores are few, the primary's cycle gets the CPU first and the "
                         "reconciler the rest. 0 leaves it as started", default=10)

    def __post_init__(self):
        if not 0 <= self.niceness <= 19:
            raise ConfigError(f"asr.niceness must be in 0..19 (a Linux nice value; only lower priority, never "
                              f"higher), got {self.niceness}")
        if self.schedule not in ASR_SCHEDULES:
            raise ConfigError(f"asr.schedule must be one of {ASR_SCHEDULES}, got {self.schedule!r}")
        _non_negative(self, "slack_margin_ms", "asr")
        if self.mode not in ASR_MODES:
            raise ConfigError(f"asr.mode must be one of {ASR_MODES}, got {self.mode!r}")
        if self.semantic_trigger not in SEMANTIC_TRIGGERS:
            raise ConfigError(f"asr.semantic_trigger must be one of {SEMANTIC_TRIGGERS}, got {self.semantic_trigger!r}")
        if self.mode == "semantic" and self.semantic_trigger == "fill" and self.rebuild_fill >= self.threshold:
            raise ConfigError(f"asr.semantic_trigger fill: asr.rebuild_fill ({self.rebuild_fill}) must be below "
                              f"asr.threshold ({self.threshold}), or every round would start the next at once")
        if not 0.0 < self.threshold <= 1.0:
            raise ConfigError(f"asr.threshold must be in (0, 1], got {self.threshold}")
        if not 0.0 < self.evict_fraction < 1.0:
            raise ConfigError(f"asr.evict_fraction must be in (0, 1), got {self.evict_fraction}")
        _positive(self, "semantic_evictions_before_rebuild", "asr")
        if not 0.0 < self.rebuild_fill <= 1.0:
            raise ConfigError(f"asr.rebuild_fill must be in (0, 1], got {self.rebuild_fill}")
        if not 0.0 < self.round_fit_margin <= 1.0:
            raise ConfigError(f"asr.round_fit_margin must be in (0, 1], got {self.round_fit_margin}")
        _positive(self, "warmup_tokens_per_step", "asr")
        _non_negative(self, "max_late_chunks", "asr")
        _positive(self, "late_frames_per_forward", "asr")
        _positive(self, "swap_poll_ms", "asr")
        if self.swap_finish not in SWAP_FINISHES:
            raise ConfigError(f"asr.swap_finish must be one of {SWAP_FINISHES}, got {self.swap_finish!r}")
        if self.export_buffers < MIN_EXPORT_BUFFERS:
            raise ConfigError(f"asr.export_buffers must be >= {MIN_EXPORT_BUFFERS} (the newest offer, the one being "
                              f"copied, and one to export into), got {self.export_buffers}")
        if self.step_layer_pieces < 1:
            raise ConfigError(f"asr.step_layer_pieces must be >= 1 (1: whole steps only), got {self.step_layer_pieces}")
        if self.backend not in BACKENDS:
            raise ConfigError(f"asr.backend must be one of {BACKENDS}, got {self.backend!r}")
        if self.device < -1:
            raise ConfigError(f"asr.device must be -1 (the primary's device) or a CUDA device index, got {self.device}")
        if self.device >= 0 and self.backend == "numpy":
            raise ConfigError(f"asr.device {self.device} picks a GPU for the reconciler, but asr.backend is numpy: "
                              f"set asr.backend pycuda (or auto), or asr.device -1")


@dataclass(frozen=True)
class LifecycleConfig:
    configure_timeout_s: float = _doc("how long bringup, the demo and the launch file wait for a node's configure "
                                      "(it loads the weights, compiles the kernels on a cold machine, captures graphs "
                                      "and warms up)", default=180.0)
    transition_timeout_s: float = _doc("how long they wait for any other lifecycle transition", default=20.0)
    first_output_timeout_s: float = _doc("the demo and soak: how long they wait for the first cycle output once the "
                                         "graph is active, then for the first action once the camera runs, before "
                                         "they stop and say what the cycles answered instead", default=30.0)
    warmup_cycles: int = _doc("reasoning: cycles run on a synthetic frame during configure (the second half seeds "
                              "the admission estimate), then forgotten", default=8)
    capacity_check_cycles: int = _doc("reasoning: cycles timed during configure with the state filled to its frame "
                                      "capacity by synthetic frames, then forgotten (core/capacity_check.py): whether "
                                      "a cycle over a full KV arena meets the deadline, and if not how many frames "
                                      "do, said in the log and /diagnostics before the first live cycle; 0 = skip",
                                      default=3)
    capacity_budget_share: float = _doc("the capacity check counts the full state as served when its cycle takes at "
                                        "most this share of the admission budget (deadline less safety margin); "
                                        "the rest is left for the slow cycles admission's tail factor allows for",
                                        default=0.9)
    parallel_configure: bool = _doc("bringup and the demo configure every lifecycle node at once, then activate them "
                                    "in order (false: configure and activate one node after the other). Meant for a "
                                    "cold GPU start, where the reconciler's configure waited for the reasoning "
                                    "node's (9-10 s of 25-32 s to active on the H200); the nodes then compile "
                                    "their kernels one at a time under a file lock and load them side by side. "
                                    "Off: not yet measured on a GPU", default=False)

    def __post_init__(self):
        _positive(self, "configure_timeout_s", "lifecycle")
        _positive(self, "transition_timeout_s", "lifecycle")
        _positive(self, "first_output_timeout_s", "lifecycle")
        if self.warmup_cycles < 2:
            raise ConfigError(f"lifecycle.warmup_cycles must be >= 2 (a new frame and a repeat), got {self.warmup_cycles}")
        _non_negative(self, "capacity_check_cycles", "lifecycle")
        if not 0.0 < self.capacity_budget_share <= 1.0:
            raise ConfigError(f"lifecycle.capacity_budget_share must be in (0, 1], got {self.capacity_budget_share}")


@dataclass(frozen=True)
class HealthConfig:
    window_s: float = _doc("the 'last second' of the /diagnostics levels: rates are counted over this window", default=1.0)
    max_fallback_rate: float = _doc("reasoning /diagnostics is WARN when the fraction of fallbacks among the cycles of "
                                    "the last window_s is above this", default=0.2)
    no_action_error_s: float = _doc("reasoning /diagnostics is ERROR when no action was published for this long while "
                                    "the node is active", default=1.0)
    reconciler_silence_s: float = _doc("reasoning /diagnostics is WARN (reconciler lost) when a reconciler that once "
                                       "answered has not answered a swap request for this long, or one timed out "
                                       "within the last window_s", default=2.0)
    log_summary_s: float = _doc("routine events (state swaps, reconciler offers) are logged at DEBUG each, and at INFO "
                                "as a running summary at most this often", default=60.0)

    def __post_init__(self):
        for name in ("window_s", "no_action_error_s", "reconciler_silence_s", "log_summary_s"):
            _positive(self, name, "health")
        if not 0.0 <= self.max_fallback_rate <= 1.0:
            raise ConfigError(f"health.max_fallback_rate must be in [0, 1], got {self.max_fallback_rate}")


@dataclass(frozen=True)
class SupervisorConfig:
    restart_backoff_s: float = _doc("`vla-edge bringup` / `demo`: wait before restarting a node whose table entry says "
                                    "respawn; doubled after each restart that did not last restart_stable_s", default=1.0)
    restart_backoff_max_s: float = _doc("the longest wait before a restart", default=30.0)
    restart_stable_s: float = _doc("a restarted node that stays up this long counts as recovered: the next restart "
                                   "waits restart_backoff_s again", default=30.0)
    stop_timeout_s: float = _doc("stopping: each node gets this long after SIGINT, then after SIGTERM, before SIGKILL",
                                 default=5.0)

    def __post_init__(self):
        for name in ("restart_backoff_s", "restart_backoff_max_s", "restart_stable_s", "stop_timeout_s"):
            _positive(self, name, "supervisor")
        if self.restart_backoff_max_s < self.restart_backoff_s:
            raise ConfigError(f"supervisor.restart_backoff_max_s ({self.restart_backoff_max_s}) must be >= "
                              f"supervisor.restart_backoff_s ({self.restart_backoff_s})")


@dataclass(frozen=True)
class DdsConfig:
    shm_health_check_ms: int = _doc(
        "`vla-edge bringup` / `demo` / `soak` and the launch file give every node process, and themselves, a Fast DDS "
        "profile whose shared-memory transport checks a port's listeners for this long (0: no profile, Fast DDS's own "
        "1000 ms; a profile already named by FASTRTPS_DEFAULT_PROFILES_FILE is kept). Why: a process that first sends "
        "to a port that another process made more than ~1 s earlier checks it first, and a check that meets an idle "
        "listener between two of its wake-ups sleeps a third of this before it looks again, with the participant's "
        "sends held: Fast DDS's 1000 ms held the demo's camera publish 320-336 ms (3 of 10 8-second demos on the 2-core "
        "machine, 3 stale_frame fallbacks each); 150 ms, 0 of 10 (slowest publish 7.2 ms; later 0 of 10 against 3 of "
        "10, one publish of 50.5 ms, a third of 150). The bound is set by whoever made the port, so it covers sends to this graph's processes, not to a foreign subscriber's. Lower wakes each "
        "idle listener more often (every third of it) and calls a port dead when its listener has not run for this "
        "long while another process opens it", default=150)

    def __post_init__(self):
        if type(self.shm_health_check_ms) is not int or not (self.shm_health_check_ms == 0
                                                              or 30 <= self.shm_health_check_ms <= 10000):
            raise ConfigError(f"dds.shm_health_check_ms must be 0 (Fast DDS's default) or in [30, 10000] ms, got "
                              f"{self.shm_health_check_ms!r}")


@dataclass(frozen=True)
class VlaConfig:
    cycle: CycleConfig = field(default_factory=CycleConfig)
    admission: AdmissionConfig = field(default_factory=AdmissionConfig)
    vision: VisionConfig = field(default_factory=VisionConfig)
    kv: KVConfig = field(default_factory=KVConfig)
    action: ActionConfig = field(default_factory=ActionConfig)
    prompt: PromptConfig = field(default_factory=PromptConfig)
    memory: MemoryConfig = field(default_factory=MemoryConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    camera: CameraConfig = field(default_factory=CameraConfig)
    asr: ASRConfig = field(default_factory=ASRConfig)
    lifecycle: LifecycleConfig = field(default_factory=LifecycleConfig)
    health: HealthConfig = field(default_factory=HealthConfig)
    supervisor: SupervisorConfig = field(default_factory=SupervisorConfig)
    dds: DdsConfig = field(default_factory=DdsConfig)

    def __post_init__(self):
        # A frame plus one cycle's suffix (prompt + decoded actions) must fit at least once.
        need = self.vision.tokens_per_frame + self.prompt.max_suffix_tokens + self.action.num_tokens
        if self.kv.capacity_tokens < need:
            raise ConfigError(
                f"kv.capacity_tokens ({self.kv.capacity_tokens}) is smaller than one frame plus one cycle's suffix "
                f"({self.vision.tokens_per_frame} + {self.prompt.max_suffix_tokens} + {self.action.num_tokens} = {need})")

    # -- flat views used by the ROS parameter layer -------------------------

    def flat(self) -> dict:
        """{'cycle.deadline_ms': 33.0, ...}: the dotted names ROS parameters use."""
        out = {}
        for sec in dataclasses.fields(self):
            section = getattr(self, sec.name)
            for f in dataclasses.fields(section):
                out[f"{sec.name}.{f.name}"] = getattr(section, f.name)
        return out

    def replace(self, overrides: dict) -> "VlaConfig":
        """A new config with dotted-name overrides applied, validated like a file."""
        nested = _nest(self.flat())
        for key, value in overrides.items():
            sec, _, name = key.partition(".")
            check_not_removed(key)
            if sec not in nested or name not in nested[sec]:
                raise ConfigError(f"unknown configuration key {key!r}")
            nested[sec][name] = value
        return from_dict(nested)


def check_not_removed(key: str) -> None:
    """ConfigError saying where the choice went when `key` is one of REMOVED_KEYS."""
    if key in REMOVED_KEYS:
        raise ConfigError(f"configuration key {key!r} was removed: {REMOVED_KEYS[key]}")


def describe() -> dict:
    """{'cycle.deadline_ms': 'control-cycle deadline; ...', ...}"""
    out = {}
    for sec_name, cls in _section_types().items():
        for f in dataclasses.fields(cls):
            out[f"{sec_name}.{f.name}"] = f.metadata.get("doc", "")
    return out


# ----------------------------------------------------------------------------
# Loading


def default_config_path() -> Path:
    """config/vla_edge.yaml of the source tree, or of the installed package (resources.py)."""
    from .resources import ResourceNotFound, config_dir
    try:
        return config_dir() / "vla_edge.yaml"
    except ResourceNotFound as exc:
        raise ConfigError(str(exc)) from exc


def load(path: str | os.PathLike | None = None, overrides: dict | None = None) -> VlaConfig:
    """Load a YAML file (plain sections or a ``/**: ros__parameters:`` block) and apply dotted overrides."""
    path = Path(path) if path else default_config_path()
    try:
        raw = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read configuration {path}: {exc}") from exc
    except yaml.YAMLError as exc:
        # PyYAML's own text spans several lines (with a caret drawing); one line says the same.
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise ConfigError(f"cannot read configuration {path}: not valid YAML{where}: "
                          f"{getattr(exc, 'problem', None) or exc}") from exc
    cfg = from_dict(_unwrap_ros(raw, path))
    return cfg.replace(overrides) if overrides else cfg


def from_dict(data: dict) -> VlaConfig:
    if not isinstance(data, dict):
        raise ConfigError(f"configuration must be a mapping of sections, got {type(data).__name__}")
    types = _section_types()
    sections = {}
    for sec_name, values in data.items():
        if sec_name not in types:
            raise ConfigError(f"unknown configuration section {sec_name!r}; known: {sorted(types)}")
        if not isinstance(values, dict):
            raise ConfigError(f"section {sec_name!r} must be a mapping, got {type(values).__name__}")
        sections[sec_name] = _build_section(sec_name, types[sec_name], values)
    return VlaConfig(**sections)


def _unwrap_ros(raw, path) -> dict:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: top level must be a mapping")
    # ROS params file: {node_name_or_/**: {ros__parameters: {...}}}; merge in file order.
    if any(isinstance(v, dict) and "ros__parameters" in v for v in raw.values()):
        merged: dict = {}
        for node, block in raw.items():
            if not (isinstance(block, dict) and set(block) == {"ros__parameters"}):
                raise ConfigError(f"{path}: entry {node!r} must hold only 'ros__parameters'")
            if not _names_a_graph_node(str(node)):
                # ROS applies a block only to the node it names: a misspelled name ("reasonig") was merged here as
                # if it applied, while the running node ignored it without a word
                raise ConfigError(f"{path}: entry {node!r} names no node of the graph; use '/**' or one of "
                                  f"{_graph_node_names()} (optionally under a namespace: '/ns/reasoning')")
            for sec, values in (block["ros__parameters"] or {}).items():
                if isinstance(values, dict):
                    merged.setdefault(sec, {}).update(values)
                else:
                    merged[sec] = values
        return merged
    return raw


def _graph_node_names() -> list:
    from .nodes.graph import NODES                 # no ROS import: the graph's description only
    return [spec.name for spec in NODES]


def _names_a_graph_node(key: str) -> bool:
    """Whether a params file's top-level key applies to a node of the graph: '/**' (or '**'), a node's name, or a
    namespaced one ('/robot1/reasoning', '/**/reasoning')."""
    last = key.rstrip("/").rsplit("/", 1)[-1]
    return last == "**" or last in _graph_node_names()


def _section_types() -> dict:
    hints = typing.get_type_hints(VlaConfig)
    return {f.name: hints[f.name] for f in dataclasses.fields(VlaConfig)}


def _build_section(sec_name: str, cls, values: dict):
    hints = typing.get_type_hints(cls)
    known = {f.name for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in values.items():
        if key not in known:
            check_not_removed(f"{sec_name}.{key}")
            raise ConfigError(f"unknown configuration key '{sec_name}.{key}'; known in {sec_name}: {sorted(known)}")
        kwargs[key] = _coerce(f"{sec_name}.{key}", hints[key], value)
    try:
        return cls(**kwargs)
    except TypeError as exc:  # pragma: no cover - dataclass signature errors
        raise ConfigError(f"section {sec_name!r}: {exc}") from exc


def _coerce(key: str, typ, value):
    """Accept exactly the YAML types that mean `typ`; ints widen to float, nothing else converts."""
    if typ is bool:
        if isinstance(value, bool):
            return value
    elif typ is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif typ is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if not math.isfinite(value):      # NaN passes every "< 0" check, and int(inf) raised deep in configure
                raise ConfigError(f"{key}: must be a finite number, got {value!r}")
            return float(value)
    elif typ is str:
        if isinstance(value, str):
            return value
    elif typ is tuple:
        if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
            return tuple(value)
    else:  # pragma: no cover
        raise ConfigError(f"{key}: unsupported field type {typ}")
    raise ConfigError(f"{key}: expected {getattr(typ, '__name__', typ)}, got {type(value).__name__} {value!r}")


def _nest(flat: dict) -> dict:
    nested: dict = {}
    for key, value in flat.items():
        sec, _, name = key.partition(".")
        nested.setdefault(sec, {})[name] = value
    return nested


def _positive(obj, name: str, section: str):
    v = getattr(obj, name)
    if not v > 0:
        raise ConfigError(f"{section}.{name} must be > 0, got {v}")


def _non_negative(obj, name: str, section: str):
    v = getattr(obj, name)
    if v < 0:
        raise ConfigError(f"{section}.{name} must be >= 0, got {v}")
