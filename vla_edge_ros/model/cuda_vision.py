"""The vision encoder's patch projection on the GPU (cuda/vision.cu), for core/vision_encoder.VisionEncoder
when `vision.on_gpu` is set.

Why: on the H200 host the numpy projection ([32, 768] x [768, 1536] in fp32, one BLAS thread) was the
cycle's third-largest phase, ~2 ms p50 of a ~18 ms cycle (`vla-edge soak`'s phase table, 2026-12-02), and
ran again in the reconciler for every mirrored frame. On the device it is two small kernels.

What a call does: the frame, already resized on the host to the encoder's size (uint8, 24 KB at 128 x 64),
is copied up, `patch_embed` and `pool_rows` run on a stream of this object's own (not the cycle's: the
reconciler encodes on its subscription thread while its worker steps on the backend's stream), the rows and
the pooled vector come back through page-locked buffers, and the stream is synchronized once. The caller
gets host arrays, as from the numpy encoder: the state keeps the rows on the host to recompute frames later.

Numerics: the same fp32 products summed in another order than numpy's sgemm, ~1e-7 of the token scale
(test_cuda_kernels.py checks 1e-5); not bit-identical to the numpy encoder, so both nodes read one
`vision.on_gpu` and, on the same GPU, compute the same bits.
"""
from __future__ import annotations

import threading

import numpy as np

from .cuda_gil_held import copy_dtoh_async, copy_htod_async


class CudaPatchProjection:
    """image [grid_rows * patch, grid_cols * patch, 3] uint8 -> (tokens [grid_rows * grid_cols, hidden] float32,
    pooled [hidden] float32) on a CudaBackend's device; its buffers are the backend's (freed by its close())."""

    def __init__(self, backend, weight: np.ndarray, bias: np.ndarray, grid_rows: int, grid_cols: int, patch: int):
        hidden, patch_dim = weight.shape
        if patch_dim != 3 * patch * patch or bias.shape != (hidden,):
            raise ValueError(f"CudaPatchProjection: weight {weight.shape} / bias {bias.shape} do not fit {patch}x{patch} "
                             f"patches")
        self.backend = backend
        self.grid_rows, self.grid_cols, self.patch = int(grid_rows), int(grid_cols), int(patch)
        self.image_shape = (self.grid_rows * self.patch, self.grid_cols * self.patch, 3)
        tokens = self.grid_rows * self.grid_cols
        device, drv = backend.device, backend.device.drv
        self._lock = threading.Lock()           # one set of buffers: one frame at a time
        self.weight = backend.device_buffer(weight.shape, np.float32, np.ascontiguousarray(weight, np.float32))
        self.bias = backend.device_buffer(bias.shape, np.float32, np.ascontiguousarray(bias, np.float32))
        self.image = backend.device_buffer(self.image_shape, np.uint8)
        self.tokens = backend.device_buffer((tokens, hidden), np.float32)
        self.pooled = backend.device_buffer((1, hidden), np.float32)
        with device.bound():
            backend.kernels.load_family("vision")      # compiled now, not at the first frame
            self.stream = drv.Stream()
            self.host_tokens = drv.pagelocked_empty((tokens, hidden), np.float32)
            self.host_pooled = drv.pagelocked_empty((1, hidden), np.float32)

    def __call__(self, image: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if image.shape != self.image_shape or image.dtype != np.uint8:
            raise ValueError(f"CudaPatchProjection: image must be uint8 {self.image_shape}, got {image.dtype} "
                             f"{image.shape}")
        backend = self.backend
        kernels, device = backend.kernels, backend.device
        with self._lock, device.bound():          # the copies keep the interpreter lock (cuda_gil_held.py)
            copy_htod_async(int(self.image.gpudata), np.ascontiguousarray(image), self.stream)
            kernels.patch_embed(self.image, self.grid_cols, self.grid_rows, self.patch, self.weight, self.bias,
                                self.tokens, self.stream)
            kernels.pool_rows(self.tokens, self.pooled, self.stream)
            copy_dtoh_async(self.host_tokens, int(self.tokens.gpudata), self.stream)
            copy_dtoh_async(self.host_pooled, int(self.pooled.gpudata), self.stream)
            self.stream.synchronize()
            return self.host_tokens.copy(), self.host_pooled[0].copy()
