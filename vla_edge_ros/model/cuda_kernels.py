"""Compile the kernel families of `cuda/*.cu` with PyCUDA and launch them with checked shapes.

One `CudaKernels` object per process/device holds the compiled modules; each
launcher checks dtypes, shapes and divisibility, computes its grid with
`ceil_div` and launches asynchronously on the given stream. Arrays are
`pycuda.gpuarray.GPUArray`s (bf16 weights are stored as uint16 bit patterns).
The projection, INT4 projection, attention and bulk-prefill launchers live in their own
modules (cuda_projection_launchers.py, cuda_int4_launchers.py, cuda_attention_launchers.py,
cuda_bulk_launchers.py) as base classes of CudaKernels;
the per-call numbers of the cycle (row offset, context length, emitted tokens)
live in the device control block described in `cuda/common.cuh`. Its indices
(CTL_*) and the projection modes (MODE_*) are read from that header
(kernel_constants.py) and served here as module attributes: `ck.MODE_ADD`.

Debugging: with VLA_EDGE_CUDA_SYNC=1 every launch is followed by a stream
synchronize, so an illegal address or launch failure raises
`KernelLaunchError` naming the kernel that caused it.

Nothing here runs at import: PyCUDA is imported and the modules compiled only
when `CudaKernels(device)` is built (device: model/cuda_device.CudaDevice), and
the families of ON_DEMAND_FAMILIES only when one of their kernels is first
launched. The .cu sources are found through vla_edge_ros/resources.py (the
source tree, or share/vla_edge_ros/cuda of an installed package, through the
ament index).
"""
from __future__ import annotations

import contextlib
import logging
import os
import re
import threading
import time
import numpy as np

from ..resources import kernel_dir
from . import kernel_constants as kc
from .cuda_attention_launchers import (ATTN_CHUNK, ATTN_DECODE_ENTRIES, ATTN_DECODE_THREADS, ATTN_MERGE_MAX_SPLITS,
                                       AttentionLaunchers)
from .cuda_bulk_launchers import BulkPrefillLaunchers
from .cuda_int4_launchers import GEMV4_ALL_ENTRIES, LEAN_SUFFIX, Int4Launchers
from .cuda_projection_launchers import GEMV_THREADS
from .cuda_launch_common import KernelError, ceil_div, ptr
from .cuda_launch_common import check as _check, check_array as _check_array

log = logging.getLogger(__name__)

SYNC_ENV = "VLA_EDGE_CUDA_SYNC"
COMPILE_LOCK_NAME = "vla_edge_kernel_compile.lock"     # in the temporary directory (_compile_lock)

# CTL_* and MODE_* come from cuda/common.cuh on first use (kernel_constants.py); the limits
# below mirror #defines of the .cu files, and test_kernel_sources.py checks that they agree.
__getattr__ = kc.reexport(__name__)

# family -> kernel name -> PyCUDA prepare() argument types
FAMILIES = {
    "embedding": {"embed_gather_bf16": "PPPii", "embed_gather_f32": "PPPii"},
    "rmsnorm": {"rmsnorm_rows": "PPPifPPi"},
    "projection_bf16": {f"projection_bf16_nt{nt}": "PPPPiiiiiiii" for nt in (1, 2, 4)},
    "projection_f32": {"projection_f32": "PPPPiiiiiii"},
    "gemv": {"gemv_bf16": "PPPfPPiiiiPPPPPPiiii", "gemv_bf16_items": "PPPfPPiiiiPPPPPPiiii"},
    "gemv_int4": {name: "PPiPPfPPiiiiPPPPPPiiii" for name in GEMV4_ALL_ENTRIES},
    "projection_int4": {f"projection_int4_nt{nt}{v}": "PPiPPPiiiiiiii"
                        for nt in (1, 2, 4) for v in ("", LEAN_SUFFIX)},
    "projection_int4_staged": {f"projection_int4_staged{v}": "PPiPPPiiiiiiii"
                               for v in ("", "_p1", "_pf", "_p1_pf", LEAN_SUFFIX)},
    "projection_staged": {"projection_staged": "PPPPiiiiiiii"},
    "rope": {"rope_store": "PiPPPPPPiiii"},
    "attention": {"attention_merge": "PPPPiiii", "attention_merge_prefetch": "PPPPiiii"},
    "attention_tiled": {"attention_partial_tiled": "PiPPPPPPiiiiifii"},   # merged by attention.cu's kernel
    "attention_mma": {f"attention_partial_mma_hd{hd}_b{b}{ma}": "PiPPPPPPiiiifii"    # merged as attention_tiled
                      for hd, b, ma in ((32, 1, ""), (64, 1, ""), (128, 1, ""), (128, 2, ""), (128, 1, "_ma"),
                                        (128, 2, "_ma"), (128, 2, "_hs"))},
    "attention_decode": {name: "PiPPPPPPiiiiif" for name in ATTN_DECODE_ENTRIES},   # merged by attention.cu's kernel
    "argmax": {"argmax_bins": "PiiPPi"},
    "kv_slots": {"kv_gather": "PPPPiiiii", "kv_scatter": "PPPPiiiii", "kv_count_nonfinite": "PqP"},
    "vision": {"patch_embed": "PiiiPPPi", "pool_rows": "PiiP", "adjacent_cosine": "PiP"},
    "decode_persistent": {f"decode_layers_v{vpl}_b{blocks}": "PiPPiPiPPPPPPPPPPiiiiiiiiiffq"
                          for vpl in (1, 2) for blocks in (1, 2)},
    "gemm_bulk": {f"gemm_bulk_p{parts}": "PqiPPPPqiiiiiii" for parts in (2, 1)},
    "gemm_wgmma": {f"gemm_wgmma_n128_p{parts}": "PqiPPPPqiiiiiii" for parts in (2, 1)},
    # two tensor maps by value: launched through cuda_param_launch.py (the string only prepares PyCUDA's copy)
    "gemm_tma": {f"{name}_p{parts}": "128s128sPPPqiiiiiii" for name in ("gemm_tma", "gemm_tma2") for parts in (2, 1)},
    "prefill_bulk": {"rmsnorm_split_rows": "PPPqifPPi", "kv_stage": "PPPPiiiiPPPP",
                     **{f"attention_flash_hd{hd}_s{st}{p}": "PiPPPPiPPPiiiif" for hd in (32, 64, 128)
                        for st, p in ((1, ""), (2, ""), (1, "_p1"), (1, "_w2"), (1, "_w2_p1"))},
                     "attention_flash_merge": "PPPqiiiii"},
    # prefill_bulk.cu's one-stage flash entries with the K/V overlap (KernelPlan.bulk_attention_kv_overlap)
    "attention_flash_kvo": {f"attention_flash_hd{hd}_s1{v}_kvo": "PiPPPPiPPPiiiif" for hd in (32, 64, 128)
                            for v in ("", "_p1", "_w2", "_w2_p1")},
    # the same with hoisted copies (_h) and with those and 64-entry tiles (_t64; KernelPlan.bulk_attention_hoisted_copies,
    # bulk_attention_tile_entries)
    "attention_flash_tiles": {f"attention_flash_hd{hd}_s1{p}_kvo_{v}": "PiPPPPiPPPiiiif" for hd in (32, 64, 128)
                              for p in ("", "_p1") for v in ("h", "t64")},
}
# Families compiled on the first launch of one of their kernels rather than by CudaKernels(): the
# decoder never launches these (vision: the GPU vision path; projection_staged, attention_mma, decode_persistent: only
# where the backend's KernelPlan (cuda_kernel_plan.py) names them; gemm_bulk, gemm_wgmma and prefill_bulk: only with
# model.bulk_prefill_min_rows; gemv_int4 and projection_int4: INT4 weights only, loaded by such a backend;
# projection_int4_staged: an INT4 backend whose plan names it; attention_flash_kvo: a bulk prefill whose plan
# names the K/V overlap; attention_flash_tiles: one whose plan names hoisted copies), so it should not pay their
# compile time.
ON_DEMAND_FAMILIES = frozenset({"vision", "projection_staged", "decode_persistent", "attention_mma", "gemm_bulk",
                                "gemm_wgmma", "gemm_tma", "prefill_bulk", "attention_flash_kvo",
                                "attention_flash_tiles", "gemv_int4", "projection_int4", "projection_int4_staged"})
# Families a fresh process leaves out of its side-by-side compile (CudaKernels: fill_disk_cache): kernels no plan in
# serving use launches (KernelPlan.persistent_decode is off, measured slower), compiled at their first use like any
# on-demand family. decode_persistent was the slowest build of the cold start's 9.8 s on the H200 (8.7 s; the next,
# attention_mma, takes half as long on the development machine); attention_flash_kvo's entries gave way to
# attention_flash_tiles' hoisted ones (KernelPlan.bulk_attention_hoisted_copies, on). vla-edge compile-kernels
# still builds them all.
COLD_START_SKIPS = frozenset({"decode_persistent", "attention_flash_kvo"})
# Families built for an architecture's own instruction set (the "a" target, e.g. sm_90a for wgmma), which no
# other architecture runs: family_arch() says where they can be built.
ARCH_SPECIFIC_FAMILIES = {"gemm_wgmma": ("sm_90",), "gemm_tma": ("sm_90",)}
# Families that read or write the KV arena (they include kv_store.cuh; test_kernel_sources.py checks the
# list): compiled with -DKV_BF16 for a bf16 arena (kv.dtype), so a module serves one arena type.
KV_FAMILIES = frozenset({"rope", "attention_tiled", "attention_mma", "attention_decode", "kv_slots", "gemv",
                         "gemv_int4", "decode_persistent", "prefill_bulk", "attention_flash_kvo",
                         "attention_flash_tiles"})
# kv.dtype -> (numpy type of the arena's elements on the device, the compile options of KV_FAMILIES).
KV_ARENA_TYPES = {"float32": (np.float32, ()), "bfloat16": (np.uint16, ("-DKV_BF16",))}


def _checked_grid(name: str, grid) -> tuple:
    """The launch grid as ints; KernelError for an empty one (a zero or negative dimension)."""
    grid = tuple(int(g) for g in grid)
    if any(g <= 0 for g in grid):
        raise KernelError(f"{name}: empty grid {grid}")
    return grid


class KernelLaunchError(RuntimeError):
    """A kernel launch or its execution failed (with VLA_EDGE_CUDA_SYNC=1: names the kernel)."""


# Kernels whose dynamic shared memory may exceed the default 48 KB (opted in at load).
DYNAMIC_SHARED_KERNELS = ("attention_partial_tiled", *FAMILIES["attention_decode"], *FAMILIES["gemv"],
                          *FAMILIES["gemv_int4"],
                          *FAMILIES["attention_mma"], *FAMILIES["gemm_bulk"], *FAMILIES["gemm_wgmma"],
                          *FAMILIES["gemm_tma"],
                          *(name for name in FAMILIES["prefill_bulk"] if name.startswith("attention_flash_hd")),
                          *FAMILIES["attention_flash_kvo"], *FAMILIES["attention_flash_tiles"],
                          *(name for name in FAMILIES["projection_int4_staged"] if name.endswith("_pf")))
DECODE_LAYER_POINTERS = 9       # decode_persistent.cu: pointers per DecodeLayer entry of the layer table


# ----------------------------------------------------------------------------
# Compilation (lazy, per context)

_lock = threading.Lock()
_modules: dict = {}            # (context handle, family, arch, extra options) -> SourceModule


def device_arch(device) -> str:
    """'sm_90' etc. of a CudaDevice (model/cuda_device.py)."""
    major, minor = device.device.compute_capability()
    return f"sm_{major}{minor}"


_LOCAL_HEADER = re.compile(r'^[ \t]*#[ \t]*include[ \t]+"([^"/]+\.cuh)"[ \t]*$', re.MULTILINE)
_PRAGMA_ONCE = re.compile(r"^[ \t]*#[ \t]*pragma[ \t]+once[ \t]*\n?", re.MULTILINE)


def family_arch(family: str, arch: str) -> str | None:
    """The nvcc target of `family` on a device of `arch`: arch itself, its "a" target for ARCH_SPECIFIC_FAMILIES
    (wgmma needs sm_90a), or None where the family cannot run on arch."""
    if family not in ARCH_SPECIFIC_FAMILIES:
        return arch
    return f"{arch}a" if arch in ARCH_SPECIFIC_FAMILIES[family] else None


def family_source(family: str) -> str:
    """cuda/<family>.cu with each `#include "<name>.cuh"` of the kernel directory pasted in: one
    self-contained translation unit (PyCUDA compiles it in a temporary directory without our headers)."""
    directory = kernel_dir()
    path = directory / f"{family}.cu"
    if not path.is_file():
        raise FileNotFoundError(f"kernel source {path} not found")
    return paste_headers(path.read_text(), directory, path.name, pasted=set())


def paste_headers(text: str, directory, origin: str, pasted: set) -> str:
    """`text` with every `#include "<name>.cuh"` replaced by that header's text, its own includes pasted
    in turn. A header is pasted at its first include only, without its `#pragma once`: later includes
    become a comment, as the pragma would have made them empty."""
    def paste(match):
        name = match.group(1)
        if name in pasted:
            return f"// {name}: pasted above"
        header = directory / name
        if not header.is_file():
            raise FileNotFoundError(f'{origin} includes "{name}", which is not in {directory}')
        pasted.add(name)
        return paste_headers(_PRAGMA_ONCE.sub("", header.read_text()), directory, name, pasted)
    return _LOCAL_HEADER.sub(paste, text)


COMPILE_OPTIONS = ["-O3", "-lineinfo"]


def family_options(family: str, kv_dtype: str = "float32") -> tuple:
    """The extra nvcc options of one family for a KV arena of `kv_dtype` (KV_ARENA_TYPES)."""
    if kv_dtype not in KV_ARENA_TYPES:
        raise ValueError(f"kv dtype {kv_dtype!r} unknown; choose one of {tuple(KV_ARENA_TYPES)}")
    return KV_ARENA_TYPES[kv_dtype][1] if family in KV_FAMILIES else ()


def compile_family(device, family: str, arch: str | None = None, options: tuple = ()):
    """SourceModule of one family in `device`'s context, compiled once per (context, family, arch, options) in
    this process (PyCUDA also keeps its on-disk cubin cache, so a second process loads instead of compiling)."""
    from pycuda.compiler import SourceModule

    arch = arch or device_arch(device)
    # A module lives in the context it was loaded in: a second context needs its own copy.
    key = (device.handle, family, arch, tuple(options))
    with _lock:
        mod = _modules.get(key)
        if mod is None:
            log.debug("compiling cuda/%s.cu for %s %s", family, arch, " ".join(options))
            with device.bound():
                mod = SourceModule(family_source(family), arch=arch, no_extern_c=True,
                                   options=COMPILE_OPTIONS + list(options))
            _modules[key] = mod
    return mod


def family_cubin(family: str, arch: str, options: tuple = ()) -> bytes:
    """The cubin of one family, compiled exactly as compile_family does (PyCUDA's disk cache answers the
    second request): cuda_pdl.py loads it a second time through cuda.bindings."""
    from pycuda.compiler import compile as compile_source

    return compile_source(family_source(family), no_extern_c=True, arch=arch,
                          options=COMPILE_OPTIONS + list(options))


@contextlib.contextmanager
def _compile_lock():
    """While held, no other process of this machine fills PyCUDA's disk cache through fill_disk_cache (a node's
    CudaKernels, `vla-edge compile-kernels`): PyCUDA writes a cubin in place (not to a temporary name renamed), so
    two nodes configured side by side (lifecycle.parallel_configure) could read each other's half-written files.
    The second one waits for the first one's compile and then finds every build on disk."""
    import fcntl
    import tempfile

    path = os.path.join(tempfile.gettempdir(), COMPILE_LOCK_NAME)
    try:
        fh = open(path, "a")
    except OSError as exc:           # e.g. made by another user: compile unlocked, as before the lock existed
        log.warning("kernel compile lock %s not usable (%s): compiling without it", path, exc)
        yield
        return
    with fh:
        t = time.perf_counter()
        fcntl.flock(fh, fcntl.LOCK_EX)
        waited = time.perf_counter() - t
        if waited > 0.5:
            log.info("waited %.1f s for another process's kernel compile", waited)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def fill_disk_cache(builds, workers: int | None = None) -> list:
    """Compile (family, arch, options) builds concurrently into PyCUDA's disk cache, as family_cubin does one;
    returns [(build, seconds, exception or None)] in the order given. Each build is one nvcc subprocess, so
    threads overlap them (no context is needed: the architecture is given). On a fresh machine the families,
    compiled one after the other inside the reasoning node's configure, took ~26 s of its 36.7 s to active on the
    H200 (2026-12-03); their single compiles take 0.5-6.8 s on the development machine (decode_persistent the
    longest, 29 s in all), so with the cores free the whole set costs about its slowest family. A build that fails
    here is left for the caller's own compile to report with its context. One process at a time (_compile_lock)."""
    from concurrent.futures import ThreadPoolExecutor

    builds = list(builds)

    def one(build):
        family, arch, options = build
        t = time.perf_counter()
        try:
            family_cubin(family, arch, options)
        except Exception as exc:  # noqa: BLE001 - CompileError, nvcc missing, a full disk: reported to the caller
            return build, time.perf_counter() - t, exc
        return build, time.perf_counter() - t, None

    if not builds:
        return []
    workers = max(1, min(len(builds), workers or os.cpu_count() or 1))
    with _compile_lock(), ThreadPoolExecutor(max_workers=workers, thread_name_prefix="nvcc") as pool:
        return list(pool.map(one, builds))


def all_builds(arch: str, kv_dtypes, families=None) -> list:
    """(family, target arch, options) of every family (or `families`) for each KV arena type, without the
    architecture-specific families `arch` cannot run; duplicates (families that do not read the arena) once."""
    builds = []
    for family in families or FAMILIES:
        target = family_arch(family, arch)
        if target is None:
            continue
        for kv_dtype in kv_dtypes:
            build = (family, target, family_options(family, kv_dtype))
            if build not in builds:
                builds.append(build)
    return builds


# ----------------------------------------------------------------------------
# Launchers


class CudaKernels(Int4Launchers, AttentionLaunchers, BulkPrefillLaunchers):
    """Compiled kernels of every family in one device's context, plus checked launchers.

    Launches go to the context current on the calling thread, which must be `device`'s
    (CudaBackend calls them inside `device.bound()`). The families of ON_DEMAND_FAMILIES
    are compiled at their first launch, so do not launch those first inside a graph capture.
    kv_dtype (KV_ARENA_TYPES): the KV arena's element type the KV_FAMILIES are compiled for."""

    def __init__(self, device, arch: str | None = None, kv_dtype: str = "float32"):
        self.device = device
        self.drv = device.drv
        self.arch = arch or device_arch(device)
        family_options("rope", kv_dtype)                  # ValueError for an unknown dtype, before any compile
        self.kv_dtype = kv_dtype
        self.kv_element = np.dtype(KV_ARENA_TYPES[kv_dtype][0])   # the arena's element on the device
        self.sync_each_launch = os.environ.get(SYNC_ENV, "") == "1"
        dev = device.device
        self.num_sms = dev.get_attribute(self.drv.device_attribute.MULTIPROCESSOR_COUNT)
        self.max_shared = dev.get_attribute(self.drv.device_attribute.MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)
        self._fns = {}
        self._shared_limits: dict = {}    # kernel -> dynamic shared memory it may use (DYNAMIC_SHARED_KERNELS)
        self.programmatic = None          # a cuda_pdl.ProgrammaticLauncher once enabled
        eager = [family for family in FAMILIES if family not in ON_DEMAND_FAMILIES]
        t0 = time.perf_counter()
        fresh = sum((device.handle, f, self.arch, family_options(f, kv_dtype)) not in _modules for f in eager)
        if fresh:
            # Every family this device can run (the on-demand ones too: warm-up launches most of them), compiled
            # side by side into the disk cache first; the loads below then read cubins. A warm cache answers each
            # build from disk in milliseconds.
            warmed = fill_disk_cache(b for b in all_builds(self.arch, (kv_dtype,))
                                     if b[0] not in COLD_START_SKIPS and (device.handle, *b) not in _modules)
            (slowest, _arch, _opts), slowest_s, _err = max(warmed, key=lambda w: w[1],
                                                           default=(("-", "", ()), 0.0, None))
            log.info("PyCUDA's disk cache: %d builds checked or compiled side by side in %.1f s (slowest: %s, %.1f s)",
                     len(warmed), time.perf_counter() - t0, slowest, slowest_s)
        for family in eager:
            self._load_family(family)
        log.info("%d kernel families ready for %s in %.1f s (%d loaded into this context: compiled, or from "
                 "PyCUDA's disk cache)", len(eager), self.arch, time.perf_counter() - t0, fresh)
        self._cooperative: dict = {}      # kernel name -> cuda_cooperative.CooperativeKernel
        self._param_launchers: dict = {}  # family -> cuda_param_launch.ParamLauncher (by-value struct parameters)

    def enable_programmatic_launch(self) -> bool:
        """Launch the kernels of cuda_pdl.PDL_KERNELS with programmatic dependent launch from now on.
        False (and ordinary launches) where the device or cuda.bindings cannot do it, with the reason logged."""
        from . import cuda_pdl

        if self.programmatic is not None:
            return True
        if not cuda_pdl.supported(self.device):
            log.warning("programmatic dependent launch needs sm_90 or newer; %s launches ordinarily", self.arch)
            return False
        try:
            self.programmatic = cuda_pdl.ProgrammaticLauncher(
                self.device, self.arch, FAMILIES,
                lambda family: family_cubin(family, self.arch, family_options(family, self.kv_dtype)),
                lambda family: family_options(family, self.kv_dtype))
            for name in self._shared_limits:
                if self.programmatic.handles(name):
                    self.programmatic.set_max_dynamic_shared(name, self._shared_limits[name])
        except (ImportError, AttributeError, cuda_pdl.ProgrammaticLaunchError) as exc:
            log.warning("programmatic dependent launch unavailable (%s: %s); launching ordinarily",
                        type(exc).__name__, exc)
            return False
        return True

    def disable_programmatic_launch(self) -> None:
        self.programmatic = None

    def load_family(self, family: str) -> None:
        """Compile an ON_DEMAND_FAMILIES family now (before a graph capture that would launch it first)."""
        if any(name not in self._fns for name in FAMILIES[family]):
            self._load_family(family)

    def _load_family(self, family: str):
        """Compile (or fetch) one family in this context and prepare its kernels for launching."""
        arch = family_arch(family, self.arch)
        if arch is None:
            raise KernelError(f"kernel family {family} needs one of {ARCH_SPECIFIC_FAMILIES[family]}; this device is "
                              f"{self.arch}")
        with self.device.bound():
            mod = compile_family(self.device, family, arch, family_options(family, self.kv_dtype))
            for name, types in FAMILIES[family].items():
                fn = mod.get_function(name)
                fn.prepare(types)
                if name in DYNAMIC_SHARED_KERNELS:
                    # Attention chunks and staged GEMV rows may need dynamic shared memory beyond the default
                    # 48 KB: opt in to the limit less the kernel's static shared memory (asking for more is an
                    # invalid argument), kept for the launchers' checks rather than queried per launch.
                    limit = self.max_shared - int(fn.get_attribute(self.drv.function_attribute.SHARED_SIZE_BYTES))
                    fn.set_attribute(self.drv.function_attribute.MAX_DYNAMIC_SHARED_SIZE_BYTES, limit)
                    self._shared_limits[name] = limit
                    if self.programmatic is not None and self.programmatic.handles(name):
                        # PDL launches its own copy of the kernel: loaded when PDL was enabled, possibly before this
                        # family (then enable_programmatic_launch could not set its limit)
                        self.programmatic.set_max_dynamic_shared(name, limit)
                self._fns[name] = fn

    def attention_mma_entries(self) -> tuple:
        """The entry points of attention_mma.cu (AttentionLaunchers checks a launch shape against them)."""
        return tuple(FAMILIES["attention_mma"])

    def _function(self, name: str):
        """The prepared kernel `name`; the first call for a kernel of ON_DEMAND_FAMILIES compiles its family."""
        if name not in self._fns:
            family = next((f for f, kernels in FAMILIES.items() if name in kernels), None)
            if family is None:
                raise KeyError(f"kernel {name} belongs to no family of FAMILIES")
            log.info("loading on-demand kernel family %s at the first launch of %s", family, name)
            self._load_family(family)
        return self._fns[name]

    def _check_shared(self, name: str, shared: int, what: str) -> None:
        """KernelError (naming `what`) when `shared` bytes of dynamic shared memory exceed what kernel `name` of
        DYNAMIC_SHARED_KERNELS was opted into; loads its family first (the limit is known once it is loaded)."""
        self._function(name)
        limit = self._shared_limits[name]
        if shared > limit:
            raise KernelError(f"{what}: {shared} bytes of shared memory > {limit}")

    def _launch(self, name: str, grid, block, stream, *args, shared: int = 0):
        grid = _checked_grid(name, grid)
        fn = self._function(name)
        try:
            if self.programmatic is not None and self.programmatic.handles(name):
                self.programmatic.launch(name, grid, block, stream, args, shared=shared)
            else:
                fn.prepared_async_call(grid, (int(block), 1, 1), stream, *args, shared_size=shared)
            if self.sync_each_launch:
                stream.synchronize()
        except self.drv.Error as exc:
            raise KernelLaunchError(f"kernel {name} grid={grid} block={block}: {exc}") from exc
        except RuntimeError as exc:          # cuda_pdl.ProgrammaticLaunchError
            raise KernelLaunchError(f"kernel {name} grid={grid} block={block}: {exc}") from exc

    def _param_launch(self, family: str, name: str, grid, block: int, stream, params: list, shared: int = 0):
        """Launch `name` through cuLaunchKernel with a parameter array (cuda_param_launch.py: gemm_tma.cu's by-value
        tensor maps), its family's cubin loaded a second time for it, with the dynamic shared memory _load_family
        opted PyCUDA's copy into."""
        from .cuda_param_launch import ParamLauncher

        grid = _checked_grid(name, grid)
        self._function(name)                         # compiled and loaded as any on-demand family
        launcher = self._param_launchers.get(family)
        if launcher is None:
            arch = family_arch(family, self.arch)
            launcher = ParamLauncher(self.device, family, arch,
                                     family_cubin(family, arch, family_options(family, self.kv_dtype)),
                                     FAMILIES[family])
            for kernel in FAMILIES[family]:
                if kernel in self._shared_limits:
                    launcher.set_max_dynamic_shared(kernel, self._shared_limits[kernel])
            self._param_launchers[family] = launcher
        try:
            launcher.launch(name, grid, block, stream, params, shared=shared)
            if self.sync_each_launch:
                stream.synchronize()
        except (KernelError, self.drv.Error) as exc:
            raise KernelLaunchError(f"kernel {name} grid={grid} block={block}: {exc}") from exc

    # -- embedding ---------------------------------------------------------

    def embed_gather(self, table, ids, out, n_rows: int, stream, ids_offset: int = 0, out_row0: int = 0):
        """out[out_row0 + i] = table[ids[ids_offset + i]], i < n_rows; ids int32 on the device."""
        _check(table.dtype in (np.uint16, np.float32), f"embed table: dtype {table.dtype}, expected uint16 (bf16) or float32")
        _check_array("ids", ids, np.int32)
        _check_array("embed out", out, np.float32, 2)
        vocab, hidden = table.shape
        _check(out.shape[1] == hidden, f"embed out: {out.shape[1]} columns, table has hidden {hidden}")
        _check(out_row0 + n_rows <= out.shape[0], f"embed out: rows {out_row0}+{n_rows} > {out.shape[0]}")
        _check(ids_offset + n_rows <= ids.size, f"ids: need {ids_offset}+{n_rows} entries, have {ids.size}")
        name = "embed_gather_bf16" if table.dtype == np.uint16 else "embed_gather_f32"
        self._launch(name, (n_rows,), 256, stream, ptr(table), ptr(ids, ids_offset), ptr(out, out_row0 * hidden),
                     np.int32(hidden), np.int32(vocab))

    # -- rmsnorm -----------------------------------------------------------

    def rmsnorm(self, x, w, out, n_rows: int, eps: float, stream, row0: int = 0, init_dst=None, init_src=None):
        """out[row0+i] = rmsnorm(x[row0+i]) * w; optionally init_dst[i] = init_src (or 0)."""
        _check_array("rmsnorm x", x, np.float32, 2)
        _check_array("rmsnorm out", out, np.float32, 2)
        _check_array("rmsnorm weight", w, np.float32, 1)
        hidden = x.shape[1]
        _check(w.shape[0] == hidden and out.shape[1] == hidden, f"rmsnorm: weight {w.shape} / out {out.shape} vs hidden {hidden}")
        _check(row0 + n_rows <= min(x.shape[0], out.shape[0]), f"rmsnorm: rows {row0}+{n_rows} exceed x/out")
        init_cols = 0
        if init_dst is not None:
            _check_array("rmsnorm init_dst", init_dst, np.float32, 2)
            init_cols = init_dst.shape[1]
            _check(n_rows <= init_dst.shape[0], f"rmsnorm init_dst: {init_dst.shape[0]} rows < {n_rows}")
            if init_src is not None:
                _check_array("rmsnorm init_src", init_src, np.float32, 1)
                _check(init_src.shape[0] == init_cols, f"rmsnorm init_src: {init_src.shape[0]} != {init_cols} columns")
        self._launch("rmsnorm_rows", (n_rows,), 256, stream, ptr(x, row0 * hidden), ptr(w), ptr(out, row0 * hidden),
                     np.int32(hidden), np.float32(eps), ptr(init_dst), ptr(init_src), np.int32(init_cols))

    # -- rope + KV store ---------------------------------------------------

    def rope_store(self, qkv, pos_table, slot_table, ctl, inv_freq, k_layer: int, v_layer: int, n_rows: int,
                   n_q_heads: int, n_kv_heads: int, head_dim: int, capacity: int, stream):
        """Rotate q in place, write rotated k and v of n_rows rows into their arena slots (k/v_layer: addresses)."""
        _check_array("rope qkv", qkv, np.float32, 2)
        _check_array("rope positions", pos_table, np.int32)
        _check_array("rope slots", slot_table, np.int32)
        _check_array("ctl", ctl, np.int32)
        _check_array("rope inv_freq", inv_freq, np.float32, 1)
        _check(head_dim % 2 == 0, f"rope: head_dim {head_dim} is odd")
        _check(inv_freq.shape[0] == head_dim // 2, f"rope inv_freq: {inv_freq.shape[0]} != head_dim/2")
        _check(qkv.shape[1] >= (n_q_heads + 2 * n_kv_heads) * head_dim, f"rope qkv: {qkv.shape[1]} columns too few")
        _check(n_rows <= qkv.shape[0], f"rope: {n_rows} rows > qkv rows {qkv.shape[0]}")
        self._launch("rope_store", (n_rows,), 128, stream, ptr(qkv), np.int32(qkv.shape[1]), ptr(pos_table),
                     ptr(slot_table), ptr(ctl), ptr(inv_freq), np.uintp(k_layer), np.uintp(v_layer),
                     np.int32(n_q_heads), np.int32(n_kv_heads), np.int32(head_dim), np.int32(capacity))

    # -- persistent decode step ---------------------------------------------

    def decode_layers(self, layer_table, resid, qkv, attn, act, part_o, part_ml, attend_list, pos_table, slot_table,
                      ctl, inv_freq, counters, *, qkv_rows: int, inter: int, gate_up_rows: int, n_q_heads: int,
                      n_kv_heads: int, head_dim: int, capacity: int, n_splits: int, eps: float, scale: float, stream,
                      blocks_per_sm: int = 1, l2_prefetch_bytes: int = 0) -> int:
        """decode_persistent.cu: every layer of one bf16 decode step (row 0 of resid) in one cooperative launch
        whose stages compute what gemv() and attention_decode() do, bit for bit. layer_table: uint64
        [n_layers, DECODE_LAYER_POINTERS] device pointers in DecodeLayer's order; counters: two uint32 zeros
        (the kernel leaves them zero). Returns the grid size (blocks)."""
        _check_array("decode layer table", layer_table, np.uint64, 2)
        _check(layer_table.shape[1] == DECODE_LAYER_POINTERS,
               f"decode layer table: {layer_table.shape[1]} pointers per layer, expected {DECODE_LAYER_POINTERS}")
        _check_array("decode counters", counters, np.uint32, 1)
        _check(counters.size >= 2, "decode counters: need 2 entries (arrived, departed)")
        for name, a in (("resid", resid), ("act", act)):
            _check_array(f"decode {name}", a, np.float32, 2)
        for name, a in (("positions", pos_table), ("slots", slot_table), ("ctl", ctl)):
            _check_array(f"decode {name}", a, np.int32)
        _check_array("decode inv_freq", inv_freq, np.float32, 1)
        group = self._attention_checks("decode", qkv, attend_list, attn, part_o, part_ml, 1, n_q_heads, n_kv_heads,
                                       head_dim, n_splits)
        hidden = resid.shape[1]
        _check(hidden % 8 == 0 and inter % 8 == 0, f"decode: hidden {hidden} and inter {inter} must be multiples of 8")
        _check(hidden == n_q_heads * head_dim, f"decode: hidden {hidden} != {n_q_heads} heads x {head_dim}")
        _check(gate_up_rows % 16 == 0 and gate_up_rows >= 2 * inter and qkv_rows % 16 == 0,
               f"decode: q|k|v rows {qkv_rows} and gate/up rows {gate_up_rows} must be whole 16-row tiles")
        _check(head_dim <= 256, f"decode: head_dim {head_dim} must be <= 256")
        _check(n_splits * ATTN_CHUNK >= capacity and n_splits <= ATTN_MERGE_MAX_SPLITS,
               f"decode: {n_splits} splits must cover {capacity} slots and be <= {ATTN_MERGE_MAX_SPLITS}")
        _check(attn.shape[1] % 4 == 0 and act.shape[1] >= inter,
               f"decode: attn {attn.shape} / act {act.shape} strides")
        kernel, grid = self._decode_layers_kernel(hidden, inter, group, head_dim, blocks_per_sm)
        name = kernel.name
        args = (ptr(layer_table), layer_table.shape[0], ptr(resid), ptr(qkv), qkv.shape[1], ptr(attn), attn.shape[1],
                ptr(act), ptr(part_o), ptr(part_ml), ptr(attend_list), ptr(pos_table), ptr(slot_table), ptr(ctl),
                ptr(inv_freq), ptr(counters), ptr(counters, 1), hidden, qkv_rows, inter, gate_up_rows, n_q_heads,
                n_kv_heads, head_dim, capacity, n_splits, eps, scale, int(l2_prefetch_bytes))
        try:
            kernel.launch(grid, stream, args)
            if self.sync_each_launch:
                stream.synchronize()
        except (RuntimeError, self.drv.Error) as exc:
            raise KernelLaunchError(f"kernel {name} grid=({grid},) block={GEMV_THREADS}: {exc}") from exc
        return grid

    def prepare_decode_layers(self, hidden: int, inter: int, n_q_heads: int, n_kv_heads: int, head_dim: int,
                              blocks_per_sm: int = 1) -> int:
        """Load decode_layers' kernel for this shape now (a graph capture must not be the first to need it);
        returns the grid size it will launch with."""
        return self._decode_layers_kernel(hidden, inter, n_q_heads // max(n_kv_heads, 1), head_dim, blocks_per_sm)[1]

    def _decode_layers_kernel(self, hidden: int, inter: int, group: int, head_dim: int, blocks_per_sm: int):
        """(CooperativeKernel, grid) of decode_persistent.cu for this shape: the entry by head_dim and blocks
        per SM, its dynamic shared memory (staged activations or attention's state), every block resident."""
        _check(blocks_per_sm in (1, 2), f"decode: blocks_per_sm {blocks_per_sm} not 1 or 2")
        shared = max(4 * max(hidden, inter), (ATTN_DECODE_THREADS // 32) * group * (8 + 4 * head_dim))
        name = f"decode_layers_v{1 if head_dim <= 128 else 2}_b{blocks_per_sm}"
        kernel = self._cooperative_kernel(name, shared)
        _check(kernel.blocks_per_sm >= 1, f"{name}: no block fits on an SM with {shared} + {kernel.static_shared} "
                                          f"bytes of shared memory")
        return kernel, self.num_sms * min(blocks_per_sm, kernel.blocks_per_sm)

    def _cooperative_kernel(self, name: str, shared: int):
        """The cuda_cooperative.CooperativeKernel `name` (loaded once) set up for `shared` dynamic bytes."""
        kernel = self._cooperative.get(name)
        if kernel is None:
            from .cuda_cooperative import CooperativeKernel
            family = next(f for f, kernels in FAMILIES.items() if name in kernels)
            kernel = CooperativeKernel(self.device, self.arch, family, name, FAMILIES[family][name],
                                       lambda fam: family_cubin(fam, self.arch, family_options(fam, self.kv_dtype)),
                                       GEMV_THREADS, family_options(family, self.kv_dtype))
            self._cooperative[name] = kernel
        if kernel.dynamic_shared != shared:
            _check(shared + kernel.static_shared <= self.max_shared,
                   f"{name}: {shared} + {kernel.static_shared} bytes of shared memory > {self.max_shared}")
            kernel.set_dynamic_shared(shared)
        return kernel

    # -- restricted argmax -------------------------------------------------

    def argmax_bins(self, logits, n_bins: int, bin_lo: int, ctl, tokens_out, rows_consumed: int, stream, logits_offset: int = 0):
        _check_array("argmax logits", logits, np.float32)
        _check_array("ctl", ctl, np.int32)
        _check_array("tokens_out", tokens_out, np.int32)
        _check(logits_offset + n_bins <= logits.size, f"argmax: {n_bins} bins exceed logits size {logits.size}")
        self._launch("argmax_bins", (1,), 256, stream, ptr(logits, logits_offset), np.int32(n_bins), np.int32(bin_lo),
                     ptr(ctl), ptr(tokens_out), np.int32(rows_consumed))

    # -- KV slots ----------------------------------------------------------

    def kv_move(self, direction: str, k_cache, v_cache, slots, staging, n: int, n_layers: int, n_kv_heads: int,
                capacity: int, head_dim: int, stream):
        """direction 'gather' (arena -> staging) or 'scatter' (staging -> arena) for n slots; the staging rows
        are in the arena's own element type (self.kv_element), copied bit for bit."""
        _check(direction in ("gather", "scatter"), f"kv_move: direction {direction!r} not 'gather' or 'scatter'")
        _check_array("kv slots", slots, np.int32)
        _check_array("kv arena", k_cache, self.kv_element)
        _check_array("kv arena", v_cache, self.kv_element)
        _check_array("kv staging", staging, self.kv_element, 4)
        _check(staging.shape[0] == 2 and staging.shape[1] == n_layers and staging.shape[3] == n_kv_heads * head_dim,
               f"kv staging: shape {staging.shape}, expected [2, {n_layers}, n_max, {n_kv_heads * head_dim}]")
        _check(n <= staging.shape[2] and n <= slots.size, f"kv_move: {n} slots > staging rows {staging.shape[2]}")
        self._launch(f"kv_{direction}", (n, n_layers, 2), 128, stream, ptr(k_cache), ptr(v_cache), ptr(slots), ptr(staging),
                     np.int32(staging.shape[2]), np.int32(n_layers), np.int32(n_kv_heads), np.int32(capacity),
                     np.int32(head_dim))

    def count_nonfinite(self, values, counter, stream, n: int | None = None):
        """counter[0] += the NaN/Inf among the first n (default all) elements of `values`, an arena-type buffer
        (self.kv_element); the caller zeroes the counter first."""
        _check_array("count_nonfinite values", values, self.kv_element)
        _check_array("count_nonfinite counter", counter, np.int32)
        n = values.size if n is None else int(n)
        _check(0 <= n <= values.size, f"count_nonfinite: {n} values > {values.size}")
        if n:
            self._launch("kv_count_nonfinite", (min(ceil_div(n, 256), 4 * self.num_sms),), 256, stream, ptr(values),
                         np.int64(n), ptr(counter))

    # -- vision ------------------------------------------------------------

    def patch_embed(self, image, grid_cols: int, grid_rows: int, patch: int, W, bias, tokens, stream):
        _check_array("vision image", image, np.uint8, 3)
        _check_array("patch_proj.weight", W, np.float32, 2)
        _check_array("patch_proj.bias", bias, np.float32, 1)
        _check_array("vision tokens", tokens, np.float32, 2)
        hidden, patch_dim = W.shape
        _check(image.shape == (grid_rows * patch, grid_cols * patch, 3),
               f"vision image: shape {image.shape}, expected {(grid_rows * patch, grid_cols * patch, 3)}")
        _check(patch_dim == 3 * patch * patch, f"patch_proj.weight: {patch_dim} columns, expected {3 * patch * patch}")
        _check(tokens.shape == (grid_rows * grid_cols, hidden), f"vision tokens: shape {tokens.shape}")
        self._launch("patch_embed", (grid_rows * grid_cols, ceil_div(hidden, 8)), 256, stream, ptr(image),
                     np.int32(image.shape[1]), np.int32(grid_cols), np.int32(patch), ptr(W), ptr(bias), ptr(tokens),
                     np.int32(hidden), shared=4 * patch_dim)

    def pool_rows(self, tokens, pooled, stream, pooled_row: int = 0):
        _check_array("vision tokens", tokens, np.float32, 2)
        n, hidden = tokens.shape
        self._launch("pool_rows", (ceil_div(hidden, 256),), 256, stream, ptr(tokens), np.int32(n), np.int32(hidden),
                     ptr(pooled, pooled_row * hidden))

    def adjacent_cosine(self, pooled, n: int, sims, stream):
        _check_array("pooled", pooled, np.float32, 2)
        _check_array("sims", sims, np.float32)
        _check(2 <= n <= pooled.shape[0] and sims.size >= n - 1, f"adjacent_cosine: n={n} vs pooled {pooled.shape}")
        self._launch("adjacent_cosine", (n - 1,), 256, stream, ptr(pooled), np.int32(pooled.shape[1]), ptr(sims))
