"""The vision encoder's patch projection on the GPU (vision.on_gpu: model/cuda_vision.py over cuda/vision.cu).

GPU only (marker `gpu`). Real footage at the camera's size goes through the encoder both ways: the GPU
projection must match the numpy one to fp32 summation order, give the same bits every time and from two
threads at once (the reconciler encodes on its subscription thread while its worker steps), and an engine
built with it must run its cycles through evictions choosing the numpy-encoder engine's action tokens.
"""
import os
import threading

import numpy as np
import pytest

from kernel_compare import assert_close

from vla_edge_ros import config as C
from vla_edge_ros.core.frames import Frame

pytestmark = pytest.mark.gpu

CAPACITY = 512


@pytest.fixture(scope="module")
def clip():
    from vla_edge_ros.bench.gpu_inputs import footage
    frames, _ = footage(os.environ.get("VLA_EDGE_FRAMES"))
    return frames[:16]


def _cfg(model_dir, on_gpu: bool):
    return C.load(overrides={"model.path": str(model_dir), "model.backend": "pycuda", "model.dtype": "float32",
                             "cycle.deterministic": True, "kv.capacity_tokens": CAPACITY,
                             "kv.eviction_policy": "fifo", "vision.on_gpu": on_gpu})


def test_gpu_projection_matches_the_numpy_encoder_and_repeats_its_bits_across_threads(tiny_model_dir, clip):
    from vla_edge_ros.core.vision_encoder import VisionEncoder
    from vla_edge_ros.model.factory import create_backend
    backend = create_backend("pycuda", tiny_model_dir, CAPACITY, "float32")
    cfg = _cfg(tiny_model_dir, True)
    hidden = backend.spec.hidden_size
    before = backend.memory_bytes()
    on_gpu, on_host = VisionEncoder(cfg.vision, hidden, backend), VisionEncoder(cfg.vision, hidden)
    assert on_gpu.device_projection is not None and on_host.device_projection is None
    assert backend.memory_bytes() > before                      # its buffers are the backend's, freed by close()
    first = [on_gpu.encode(f) for f in clip]
    for frame, got in zip(clip, first):
        want = on_host.encode(frame)
        assert got.tokens.shape == want.tokens.shape and got.tokens.dtype == np.float32
        # fp32 sums of 768 products in another order than numpy's sgemm: ~1e-7 of the token scale.
        assert_close(got.tokens, want.tokens, rtol=0.0, atol=1e-5, what="tokens")
        assert_close(got.pooled, want.pooled, rtol=0.0, atol=1e-5, what="pooled")
    results = {}

    def encode_all(name):
        results[name] = [on_gpu.encode(f) for f in clip]
    threads = [threading.Thread(target=encode_all, args=(n,)) for n in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for name in ("a", "b"):
        for got, ref in zip(results[name], first):
            assert np.array_equal(got.tokens, ref.tokens) and np.array_equal(got.pooled, ref.pooled)
    with pytest.raises(ValueError, match="uint8"):
        on_gpu.device_projection(np.zeros((4, 4, 3), np.uint8))
    assert backend.close() > 0


def test_engine_with_the_gpu_projection_picks_the_numpy_encoders_tokens(tiny_model_dir, clip):
    from vla_edge_ros.core.engine import Engine
    from vla_edge_ros.model.factory import create_backend
    from vla_edge_ros.model.weights import load_tokenizer
    engines = {}
    for on_gpu in (True, False):
        backend = create_backend("pycuda", tiny_model_dir, CAPACITY, "float32")
        engines[on_gpu] = Engine(_cfg(tiny_model_dir, on_gpu), backend, load_tokenizer(tiny_model_dir))
    assert engines[True].state.encoder.device_projection is not None
    evictions = 0
    for i, pixels in enumerate(list(clip) * 2):
        results = [engines[k].run_cycle(Frame(pixels=pixels, stamp_s=i / 30, frame_id=i), now_s=i / 30)
                   for k in (True, False)]
        assert all(r.is_action for r in results), [r.detail for r in results]
        assert np.array_equal(results[0].tokens, results[1].tokens), i
        assert results[0].evicted_frame_ids == results[1].evicted_frame_ids, i
        evictions += len(results[0].evicted_frame_ids)
    assert evictions > 0
    for engine in engines.values():
        engine.close()
