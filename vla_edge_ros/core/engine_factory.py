"""The one place engines are built from a configuration: the nodes, tools and tests all come here.

    primary_engine(cfg)      the reasoning node's engine (control cycle + frame state):
                             backend model.backend
    swap_kv_mapper(backend)  the reasoning side's opener of KV offered over CUDA IPC
    reconciler_state(cfg)    the reconciler's frame state (no cycle): backend asr.backend; on
                             a GPU its snapshots keep their KV on the device
                             (DeviceKvExporter), so a swap moves it by CUDA IPC, not a file;
                             forward() prepared for every reconciler step size (1 frame up to
                             asr.warmup_tokens_per_step), so no step captures a graph in a gap

Both load the tokenizer and build the backend through model/factory.py (the
CUDA backend streams the weights to the device; the numpy backend loads them
as float32), in a process whose BLAS uses model.cpu_threads threads.
"""
from __future__ import annotations

import logging
import time

from ..config import VlaConfig
from ..model.factory import choose_backend, create_backend, resolve_kind
from ..model.generation_board import GenerationBoard
from ..model.weights import load_tokenizer
from .cpu_threads import limit_cpu_threads
from .engine import Engine
from .engine_state import FrameState
from .stale_snapshots import private_directory
from .swap_protocol import snapshot_base
from .vision_encoder import VisionEncoder

log = logging.getLogger(__name__)


def primary_engine(cfg: VlaConfig, device=None, steps_s: dict | None = None) -> Engine:
    """The serving engine of `cfg` (model.backend); device: a CudaDevice for the GPU backend (default device 0).
    steps_s: filled with the seconds each build step took ("backend": weights loaded or streamed to the device,
    kernels compiled; "engine": the prefix computed, the cycle prepared), for the node's configure log."""
    return _engine(cfg, cfg.model.backend, device, {} if steps_s is None else steps_s)


def reconciler_state(cfg: VlaConfig, device=None) -> FrameState:
    """The reconciler's frame state (asr.backend; it runs no control cycle, so no Engine around it); on a
    GPU its snapshots' KV stays on the device."""
    limit_cpu_threads(cfg.model.cpu_threads)
    if device is None and resolve_kind(cfg.asr.backend) == "pycuda":
        device = reconciler_device(cfg.asr.device)
    backend = create_backend(cfg.asr.backend, cfg.model.path, cfg.kv.capacity_tokens, dtype=cfg.model.dtype,
                             device=device, kernel_options=backend_options(cfg), kv_dtype=cfg.kv.dtype,
                             weights=cfg.model.weights)
    try:
        state = FrameState(cfg, backend, load_tokenizer(cfg.model.path), reconciler_encoder(cfg, backend.spec),
                           takes_swaps=False)
        backend.prepare_forward(reconciler_step_rows(cfg), pieces=cfg.asr.step_layer_pieces)
        if backend.device is not None:
            state.kv_export = _device_exporter(cfg, backend)
        return state
    except BaseException:
        backend.close()
        raise


def _device_exporter(cfg: VlaConfig, backend):
    """The GPU reconciler's KV exporter, with its host generation board when asr.host_generation_board."""
    from ..model.cuda_state_transfer import DeviceKvExporter          # lazy: imports pycuda
    board = None
    if cfg.asr.host_generation_board:
        try:
            board = GenerationBoard(cfg.asr.export_buffers, private_directory(snapshot_base()))
        except OSError as exc:             # optional: the primary's check then reads the device word
            log.warning("asr.host_generation_board: cannot make the board (%s); offers go without it", exc)
    try:
        return DeviceKvExporter(backend, cfg.asr.export_buffers, board=board)
    except BaseException:
        if board is not None:
            board.close()
        raise


def backend_options(cfg: VlaConfig) -> dict:
    """The CUDA backend's keyword arguments from `cfg` (the numpy backend takes none): the kernel options, and
    memory.vram_ceiling_gib as the ceiling it checks its plan against before allocating anything. Before, the nodes'
    backends kept their own 8 GiB default while the engine checked the configured figure, so a preset that raised
    the key (a larger model) was refused by the backend anyway; the reconciler, which has no engine, now has the
    configured ceiling too."""
    return {**cfg.model.kernel_options(), "vram_ceiling_bytes": cfg.memory.vram_ceiling_bytes}


def reconciler_encoder(cfg: VlaConfig, spec) -> VisionEncoder:
    """The reconciler's vision encoder: the numpy projection whatever vision.on_gpu says. It encodes each frame
    as the chunk arrives, on the subscription's thread, outside the slack schedule that keeps its GPU work in
    the primary's gaps; on the GPU that encode could land inside a primary cycle (two contexts time-slice the
    GPU). Its rows differ from the primary's GPU rows by ~1e-7 of the token scale (model/cuda_vision.py), far
    below the bf16 rounding of everything computed from them."""
    return VisionEncoder(cfg.vision, spec.hidden_size)


def reconciler_device(requested: int):
    """The CudaDevice (primary context) a GPU reconciler runs on for asr.device `requested`
    (model/cuda_device.reconciler_device_index, which logs the choice and warns of a fallback)."""
    from ..model.cuda_device import primary_device, reconciler_device_index   # lazy: imports pycuda
    return primary_device(reconciler_device_index(requested)[0])


def swap_kv_mapper(backend):
    """The reasoning side's opener of offered KV left on the reconciler's GPU (model/cuda_ipc.IpcKvMapper:
    `open(descriptor)` -> an IpcKV, `close()`), for a backend on a GPU; None on the CPU (offers carry host KV)."""
    if backend.device is None:
        return None
    from ..model.cuda_ipc import IpcKvMapper       # lazy: imports pycuda
    return IpcKvMapper(backend.device)


def reconciler_step_rows(cfg: VlaConfig) -> list[int]:
    """The row counts of every step the reconciler may take: 1 .. asr.warmup_tokens_per_step // tpf frames."""
    tpf = cfg.vision.tokens_per_frame
    return [tpf * k for k in range(1, max(1, cfg.asr.warmup_tokens_per_step // tpf) + 1)]


def describe_choice(kind: str) -> str:
    """One line: which backend `kind` (auto | numpy | pycuda) means here, and why."""
    return choose_backend(kind).describe()


def _engine(cfg: VlaConfig, kind: str, device, steps_s: dict) -> Engine:
    t0 = time.perf_counter()
    limit_cpu_threads(cfg.model.cpu_threads)
    tokenizer = load_tokenizer(cfg.model.path)
    backend = create_backend(kind, cfg.model.path, cfg.kv.capacity_tokens, dtype=cfg.model.dtype, device=device,
                             kernel_options=backend_options(cfg), kv_dtype=cfg.kv.dtype, weights=cfg.model.weights)
    t1 = time.perf_counter()
    steps_s["backend"] = t1 - t0
    try:
        engine = Engine(cfg, backend, tokenizer)
        steps_s["engine"] = time.perf_counter() - t1
        return engine
    except BaseException:
        backend.close()              # a configuration the engine refuses leaves no device memory behind
        raise
