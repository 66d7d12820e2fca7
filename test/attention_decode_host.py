"""The attention launchers and plan choice without a device, for the CPU tests of their entries
(test_decode_attention_prefetch.py, test_decode_attention_exact_group.py, test_attention_masked_softmax.py,
test_attention_head_halves.py): launches recorded instead of made, and CudaBackend._attention_in_effect asked about
a model of a given grouping.
"""
import re
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from vla_edge_ros.model import cuda_attention_launchers as ca
from vla_edge_ros.model import cuda_kernels as ck
from vla_edge_ros.model.cuda_backend import CudaBackend


CUDA = Path(__file__).resolve().parents[1] / "cuda"


def declared_decode_entries() -> dict:
    """attention_decode.cu's DECODE_PARTIAL_ENTRY lines: {kernel name: (warps per slot group, MAX_GROUP as written,
    prefetch, exact group)}."""
    source = (CUDA / "attention_decode.cu").read_text()
    return {f"attention_decode_partial_v{vpl}{suffix}": (int(hs), group, pf == "true", exact == "true")
            for vpl, hs, group, pf, suffix, exact in
            re.findall(r"^DECODE_PARTIAL_ENTRY\((\d), (\d), (\w+), (true|false), (\w*), (true|false)\)", source,
                       re.MULTILINE)}


class Recorder(ca.AttentionLaunchers):
    """The attention launchers without a device: every launch recorded as (kernel, grid, block)."""
    num_sms = 132
    max_shared = 227 * 1024

    def __init__(self):
        self.launches = []

    def _launch(self, name, grid, block, stream, *args, shared=0):
        self.launches.append((name, tuple(grid), block))


class MmaRecorder(Recorder):
    """Recorder with attention_mma.cu's entries, on a bf16 arena, no shared-memory limit checked."""
    kv_dtype = "bfloat16"

    def attention_mma_entries(self):
        return tuple(ck.FAMILIES["attention_mma"])

    def _check_shared(self, name, shared, what):
        pass


def declared_mma_entries() -> dict:
    """attention_mma.cu's ATTENTION_MMA_ENTRY lines: {kernel name: (masked softmax, head halves)}."""
    source = (CUDA / "attention_mma.cu").read_text()
    return {f"attention_partial_mma_hd{hd}_b{b}{suffix}": (masked == "true", int(halves)) for hd, b, masked, halves, suffix
            in re.findall(r"^ATTENTION_MMA_ENTRY\((\d+), (\d), (true|false), (\d), (\w*)\)", source, re.MULTILINE)}


def array(shape, dtype=np.float32):
    """What the launcher reads of a device array: shape, dtype, size and an address."""
    return SimpleNamespace(shape=tuple(shape), dtype=np.dtype(dtype), size=int(np.prod(shape)), gpudata=1 << 20)


def decode(kn, hq, kvh, hd=128, **kw):
    """One attention_decode call of one row over a 4096-slot arena; returns the partial sums' launch."""
    cap, n_splits = 4096, 64
    kn.attention_decode(array((1, (hq + 2 * kvh) * hd)), 0, 0, array((cap,), np.int32), array((4,), np.int32),
                        array((1, hq, n_splits, hd)), array((1, hq, n_splits, 2)), array((1, hq * hd)), 1, hq, kvh,
                        hd, cap, n_splits, hd ** -0.5, None, **kw)
    return kn.launches[-2]                                  # the partial sums' launch; the merge's follows


def in_effect(plan, num_heads, num_kv_heads, head_dim=128, dtype="bfloat16"):
    """CudaBackend._attention_in_effect of a model of that grouping (nothing else of a backend is read)."""
    fake = SimpleNamespace(dtype=dtype, spec=SimpleNamespace(num_heads=num_heads, num_kv_heads=num_kv_heads,
                                                             head_dim=head_dim),
                           kernels=SimpleNamespace(load_family=lambda family: None))
    return CudaBackend._attention_in_effect(fake, plan)
