"""CSR ordering on the real engine: the prefix is computed once, frames are appended, the suffix is transient.

Real parts only: the seeded tiny model, the numpy backend, the vision encoder
and real footage. Every forward the engine makes goes through the backend's
real `forward`; a recording wrapper only notes which slots each call wrote.
"""
import numpy as np
import pytest

from vla_edge_ros import config as C
from vla_edge_ros.core.engine import Engine
from vla_edge_ros.core.engine_state import SwapTimingError
from vla_edge_ros.core.footage import read_clip
from vla_edge_ros.core.frames import Frame
from vla_edge_ros.model.host_cycle import HostLoopCycles
from vla_edge_ros.core.prompt import encode_text, prefix_text, suffix_ids


@pytest.fixture(scope="module")
def clip():
    return read_clip("bikes.mp4", max_frames=40)


class RecordingBackend(HostLoopCycles):
    """Delegates everything to a real backend and records the write slots of each forward; its cycle is the
    numpy backend's own loop (HostLoopCycles), run through this wrapper's forward so it is recorded too."""

    def __init__(self, backend):
        self._backend = backend
        self.writes = []

    def forward(self, x, positions, write_slots, context_slots, **kw):
        self.writes.append(np.asarray(write_slots).copy())
        return self._backend.forward(x, positions, write_slots, context_slots, **kw)

    def __getattr__(self, name):
        return getattr(self._backend, name)


def make_engine(model_dir, **overrides):
    from vla_edge_ros.model.factory import create_backend, load_model
    cfg = C.load(overrides={"model.path": str(model_dir), "model.backend": "numpy", "cycle.deterministic": True,
                            **overrides})
    _spec, _weights, tokenizer = load_model(model_dir)
    backend = RecordingBackend(create_backend("numpy", model_dir, capacity=cfg.kv.capacity_tokens))
    return Engine(cfg, backend, tokenizer)


def test_prefix_is_never_recomputed_and_the_suffix_is_released_every_cycle(tiny_model_dir, clip):
    eng = make_engine(tiny_model_dir, **{"kv.capacity_tokens": 384})      # room for ~9 frames: eviction starts early
    prefix_slots = eng.state.prefix_slots.copy()
    assert len(eng.backend.writes) == 1 and np.array_equal(eng.backend.writes[0], prefix_slots)
    prefix_kv = eng.backend.read_kv(prefix_slots)
    tpf, s, steps = 32, int(eng.suffix.size), eng.cfg.action.num_tokens - 1
    for i, px in enumerate(clip):
        before = len(eng.backend.writes)
        r = eng.run_cycle(Frame(px, float(i), i), now_s=float(i))
        assert r.is_action, r.detail
        calls = eng.backend.writes[before:]
        # One prefill of [new frame + suffix] rows, then one row per decode step: never the cached context.
        assert [w.size for w in calls] == [tpf + s] + [1] * steps
        assert r.prefill_tokens == tpf + s
        assert not np.isin(np.concatenate(calls), prefix_slots).any(), f"cycle {i} wrote into the prefix"
        assert eng.state.kv.transient_slots == 0                                  # suffix + decoded tokens released
        assert eng.state.kv.used_slots == prefix_slots.size + len(eng.state.frames) * tpf
    summary = eng.state_summary()
    assert summary["evictions"] > 0
    np.testing.assert_array_equal(eng.backend.read_kv(prefix_slots), prefix_kv)   # bytes unchanged
    assert summary["computed_tokens"] == {"prefix": prefix_slots.size, "frames": tpf * len(clip),
                                          "suffix": s * len(clip), "decode": steps * len(clip)}


def test_state_summary_accounts_prefix_chunks_and_suffix_separately(tiny_model_dir, clip):
    eng = make_engine(tiny_model_dir)
    prefix = encode_text(eng.tokenizer, prefix_text(eng.cfg.prompt))
    for i in range(3):
        eng.run_cycle(Frame(clip[i], float(i), i), now_s=float(i))
    s = eng.state_summary()
    assert (s["prefix_tokens"], s["frames"], s["frame_tokens"]) == (prefix.size, 3, 96)
    assert s["suffix_tokens"] == suffix_ids(eng.tokenizer, eng.cfg.prompt, eng.cfg.prompt.instruction).size
    assert s["transient_tokens"] == 0 and s["next_position"] == prefix.size + 96
    assert s["state_exact"] and s["approximate_evictions"] == 0

    eng.set_instruction("stack the green cube on top of the blue cylinder, slowly")
    eng.run_cycle(Frame(clip[3], 3.0, 3), now_s=3.0)
    t = eng.state_summary()
    assert t["prefix_tokens"] == s["prefix_tokens"] and t["frames"] == 4
    assert t["suffix_tokens"] == eng.suffix.size != s["suffix_tokens"]
    assert t["computed_tokens"]["prefix"] == prefix.size                 # a new instruction touches only the suffix


def test_evictions_mark_the_state_approximate_and_a_rebuild_rebases_it(tiny_model_dir, clip):
    eng = make_engine(tiny_model_dir, **{"kv.capacity_tokens": 384, "kv.eviction_policy": "fifo"})
    for i in range(14):
        eng.run_cycle(Frame(clip[i], float(i), i), now_s=float(i))
    held = [r.frame_id for r in eng.state.kv.retained()]
    assert eng.state.approximate_evictions == 14 - len(held) and not eng.state.state_exact
    starts = [r.position_start for r in eng.state.kv.retained()]
    assert starts[0] > eng.state.prefix_tokens                                 # a hole where evicted frames were

    writes_before = len(eng.backend.writes)
    dropped = eng.state.rebuild_in_place(held[2:], tokens_per_step=64)
    assert dropped == held[:2] and eng.state.state_exact
    kept = len(held) - 2
    assert [w.size for w in eng.backend.writes[writes_before:]] == [64] * (kept // 2) + [32] * (kept % 2)
    starts = [r.position_start for r in eng.state.kv.retained()]
    assert starts == [eng.state.prefix_tokens + 32 * k for k in range(len(held) - 2)]   # contiguous after the prefix
    assert eng.state.next_position == eng.state.prefix_tokens + 32 * (len(held) - 2)


def test_state_changes_are_refused_inside_a_cycle(tiny_model_dir, clip):
    eng = make_engine(tiny_model_dir)
    eng.run_cycle(Frame(clip[0], 0.0, 0), now_s=0.0)
    snap = eng.state.export_state(version=1)
    seen = []
    real_forward = eng.backend.forward

    def forward_that_tries_a_swap(*a, **kw):
        if not seen:
            try:
                eng.state.import_state(snap)        # e.g. a swap loader thread firing mid-cycle
            except SwapTimingError as exc:
                seen.append(str(exc))
        return real_forward(*a, **kw)

    eng.backend.forward = forward_that_tries_a_swap
    r = eng.run_cycle(Frame(clip[1], 1.0, 1), now_s=1.0)
    assert r.is_action and seen and "cycle boundaries" in seen[0]
    assert eng.state.state_version == 0
    assert eng.state.swap_fixed_ms_tail == 0.0
    eng.state.import_state(snap)                    # at the boundary it is fine
    assert eng.state.state_version == 1
    # What it cost besides a recompute is what the next swap's budget keeps room for.
    r = eng.state.last_swap
    assert eng.state.swap_fixed_ms_tail == pytest.approx(r.check_ms + r.place_ms + r.kv_copy_ms)
    assert eng.state.swap_fixed_ms_tail > 0.0


def test_a_huge_instruction_keeps_the_tokens_a_short_cut_keeps(tiny_model_dir):
    """An instruction of megabytes is cut to its end before it is tokenized (the cycle thread tokenized all of it
    at the boundary: 39 boundaries, ~2 s, without actions); the tokens kept are its last ones either way."""
    from vla_edge_ros.core.prompt import instruction_char_limit
    eng = make_engine(tiny_model_dir)
    cfg = eng.cfg.prompt
    words = " ".join(f"word{i}" for i in range(300_000))                       # ~2.3 MB
    cut = suffix_ids(eng.tokenizer, cfg, words)
    whole = encode_text(eng.tokenizer, f"\nTask: {words}\n{cfg.action_prompt}")[-cfg.max_suffix_tokens:]
    np.testing.assert_array_equal(cut, whole)
    assert instruction_char_limit(cfg) < len(words) // 100
