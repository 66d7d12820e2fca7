"""What the reconciler keeps across aborted rounds: bounded by its arena, however many rounds it gives up.

The 3-minute semantic soak on the H200 (notes/runs/soak_semantic_2026-12-03s3.txt) aborted 128 of 153 rounds
(no_longer_fits) and the reconciler's resident memory grew +14.6 MiB after the first minute. The vision rows it
mirrors (32 x 1536 float32, 192 KiB a frame) were kept for every tracked offer of an aborted round, up to
MAX_OFFERS_TRACKED of them, until the primary applied something newer.
"""
import numpy as np
import pytest

from vla_edge_ros import config as C
from vla_edge_ros.core.engine_state import FrameState
from vla_edge_ros.core.reconciliation import StateReconciler
from vla_edge_ros.core.state_snapshot import StateChunk

CAPACITY = 384        # KV slots: 9 frames of 32 tokens beside the prefix and one cycle's suffix


@pytest.fixture(scope="module")
def model(tiny_model_dir):
    from vla_edge_ros.model.factory import load_model
    return load_model(tiny_model_dir)


class Camera:
    """The reconciler's clock: one camera period per frame, so that its measured rates (core/round_budget.py) are
    deterministic; work drained inside one period takes no time."""

    def __init__(self, hz: float):
        self.period, self.now = 1.0 / hz, 0.0

    def __call__(self) -> float:
        return self.now


def reconciler(model_dir, model, camera: Camera, **overrides) -> StateReconciler:
    from vla_edge_ros.model.factory import create_backend_from_weights
    spec, weights, tokenizer = model
    cfg = C.load(overrides={"model.path": str(model_dir), "model.backend": "numpy", "kv.capacity_tokens": CAPACITY,
                            **overrides})
    state = FrameState(cfg, create_backend_from_weights("numpy", spec, weights, CAPACITY), tokenizer, takes_swaps=False)
    return StateReconciler(cfg, state, clock=camera)


def chunk(rng, frame_id: int, tpf: int, hidden: int) -> StateChunk:
    return StateChunk(frame_id, float(frame_id), rng.standard_normal((tpf, hidden)).astype(np.float32),
                      rng.standard_normal(hidden).astype(np.float32))


@pytest.mark.parametrize("mode, policy", [("semantic", "semantic"), ("csr", "fifo")])
def test_vision_rows_kept_stay_bounded_when_the_primary_never_applies_an_offer(tiny_model_dir, model, mode, policy):
    """Every round is offered (the reconciler keeps up), its offer taken and never applied: the round keeps
    catching up until it outgrows the arena and is aborted, again and again. The mirrored vision rows kept are
    those of the frames the primary holds, the round's, and the offers of the newest aborted round (the only ones
    the primary may still be applying): at most three arenas' worth, not one per tracked offer."""
    camera = Camera(30.0)
    rec = reconciler(tiny_model_dir, model, camera, **{"asr.mode": mode, "kv.eviction_policy": policy})
    cap, tpf, hidden = rec.state.frame_capacity, rec.tpf, rec.state.backend.spec.hidden_size
    rng = np.random.default_rng(0)
    most = 0
    for frame_id in range(400):
        camera.now += camera.period
        rec.mirror_encoded(chunk(rng, frame_id, tpf, hidden))
        while rec.tick():
            pass
        rec.take_offer()                     # taken by the primary, which never applies it
        most = max(most, len(rec._chunks))
    st = rec.stats
    assert st.rounds_aborted >= 40 and st.rounds_applied == 0 and st.rounds_offered >= 40, st
    assert most <= 3 * cap + 1, f"{most=} mirrored frames kept, arena {cap} frames"
