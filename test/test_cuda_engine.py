"""The engine's cycle on the device path (CudaBackend.run_cycle_tokens) against the host-loop path.

GPU only (marker `gpu`). With a CUDA backend the engine runs each cycle as one
device program (prefill, restricted argmax, decode steps feeding tokens back on
the device). The reference is the same engine logic stepping through
`forward` with logits on the host, and the numpy engine (itself held against
HF transformers in test_engine.py). fp32 weights, so the three must choose the
same action tokens on every cycle, through evictions.
"""
import os

import numpy as np
import pytest

from engine_oracle import cosine

from vla_edge_ros import config as C
from vla_edge_ros.core.frames import Frame
from vla_edge_ros.model.host_cycle import HostLoopCycles

pytestmark = pytest.mark.gpu

CAPACITY = 512          # a few frames fit: the run goes through several evictions
CYCLES = 24


@pytest.fixture(scope="module")
def clip():
    from vla_edge_ros.bench.gpu_inputs import footage
    frames, _ = footage(os.environ.get("VLA_EDGE_FRAMES"))
    return frames[:CYCLES]


class HostLoopBackend(HostLoopCycles):
    """The CUDA backend with its cycle run as the host loop of `forward` calls (model/host_cycle.py), logits
    on the host: the reference the device cycle must match."""

    def __init__(self, backend):
        self._backend = backend

    def __getattr__(self, name):
        return getattr(self._backend, name)


def _engine(model_dir, backend: str, host_loop: bool = False):
    from vla_edge_ros.core.engine import Engine
    from vla_edge_ros.model.factory import create_backend
    from vla_edge_ros.model.weights import load_tokenizer
    cfg = C.load(overrides={"model.path": str(model_dir), "model.backend": backend, "model.dtype": "float32",
                            "cycle.deterministic": True, "kv.capacity_tokens": CAPACITY,
                            "kv.eviction_policy": "semantic"})
    b = create_backend(backend, model_dir, CAPACITY, "float32")      # pycuda: streamed from the directory
    return Engine(cfg, HostLoopBackend(b) if host_loop else b, load_tokenizer(model_dir))


def test_device_cycle_picks_the_host_loops_tokens_through_evictions(tiny_model_dir, clip):
    device = _engine(tiny_model_dir, "pycuda")
    host = _engine(tiny_model_dir, "pycuda", host_loop=True)
    ref = _engine(tiny_model_dir, "numpy")
    evictions = 0
    for i, px in enumerate(clip):
        frame = Frame(pixels=px, stamp_s=float(i), frame_id=i + 1)
        results = [e.run_cycle(frame, now_s=float(i)) for e in (device, host, ref)]
        for r in results:
            assert r.is_action, r.detail
        assert results[0].tokens.tolist() == results[1].tokens.tolist() == results[2].tokens.tolist(), f"cycle {i}"
        assert results[0].evicted_frame_ids == results[2].evicted_frame_ids
        evictions += len(results[0].evicted_frame_ids)
        # The device path computes only the action bins in the cycle; full logits are fetched on demand.
        assert cosine(device.last_prefill_logits, ref.last_prefill_logits) >= 0.99999, f"cycle {i}"
        assert results[0].prefill_ms > 0 and results[0].decode_ms > 0
    assert evictions >= 3, "the run was meant to go through evictions"
    summaries = [{k: v for k, v in e.state_summary().items() if k != "memory_bytes"} for e in (device, ref)]
    assert summaries[0] == summaries[1]


def test_device_cycle_nan_is_a_fallback_and_the_frame_is_forgotten(tiny_model_dir, clip, cuda_device):
    from vla_edge_ros.core import cycle_result as R
    eng = _engine(tiny_model_dir, "pycuda")
    assert eng.run_cycle(Frame(pixels=clip[0], stamp_s=0.0, frame_id=1), now_s=0.0).is_action
    norm = eng.backend.final_norm                 # device array: corrupt it as a bad upload would
    good = norm.get()
    norm.fill(np.float32(np.nan))
    bad = eng.run_cycle(Frame(pixels=clip[1], stamp_s=1.0, frame_id=2), now_s=1.0)
    assert bad.reason == R.ENGINE_ERROR and "non-finite" in bad.detail, bad.detail
    assert eng.state_summary()["frames"] == 1                     # the poisoned frame left no KV behind
    norm.set(good)
    ok = eng.run_cycle(Frame(pixels=clip[2], stamp_s=2.0, frame_id=3), now_s=2.0)
    assert ok.is_action, ok.detail
