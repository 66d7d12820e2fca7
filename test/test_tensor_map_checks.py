"""cuda_tensor_map.check_tiled: what the TMA GEMM's tensor maps must satisfy, refused on the host with the reason
before the driver (or the kernel) meets it. Pure Python: runs without a GPU (the encoding itself is in
test_cuda_bulk_prefill.py)."""
import pytest

from vla_edge_ros.model.cuda_launch_common import KernelError
from vla_edge_ros.model.cuda_tensor_map import check_tiled


def test_a_map_the_tma_gemm_uses_passes():
    check_tiled(1 << 20, (1536, 300, 2), (3072, 1 << 20), (64, 128, 1))     # activations: K, M, hi/lo parts
    check_tiled(1 << 20, (1536, 2048), (3072,), (64, 128))                  # weights: K, N


@pytest.mark.parametrize("address, dims, strides, box, reason", [
    ((1 << 20) + 8, (1536, 300), (3072,), (64, 128), "16-byte"),          # misaligned base
    (1 << 20, (1536, 300), (3000,), (64, 128), "16-byte"),                 # a row stride of 1500 bf16
    (1 << 20, (1536, 300), (3072,), (32, 128), "64 bf16 wide"),           # not the 128-byte swizzle's row
    (1 << 20, (1536, 300), (3072,), (64, 512), "<= 256"),                 # a box taller than TMA copies
    (1 << 20, (1536, 0), (3072,), (64, 128), "dims"),                     # an empty dimension
    (1 << 20, (1536,), (), (64,), "rank"),                                # rank 1
    (1 << 20, (1536, 300), (3072, 16), (64, 128), "rank"),                # strides that do not fit the rank
])
def test_what_the_driver_would_refuse_is_refused_by_name(address, dims, strides, box, reason):
    with pytest.raises(KernelError, match=reason):
        check_tiled(address, dims, strides, box)
