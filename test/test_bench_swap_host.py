"""bench/swap_host.py on the tiny model: the swap of this code leaves the slots and frames the swap of before
left, swap after swap, and its timing parts add up (no timing limits here: speed is the benchmark's)."""
from pathlib import Path

from vla_edge_ros import config as C
from vla_edge_ros.bench import swap_host
from slot_bookkeeping_before import BaselineFrameState
from vla_edge_ros.core.engine_state import FrameState


def test_the_swap_leaves_the_same_slots_and_frames_as_before(tiny_model_dir, tmp_path):
    cfg = C.load(overrides={"model.path": str(tiny_model_dir), "model.backend": "numpy",
                            "kv.capacity_tokens": 1024, "cycle.deterministic": True})
    sides = {"before": swap_host._Side(cfg, Path(tiny_model_dir), BaselineFrameState, tmp_path / "b", precheck=False),
             "after": swap_host._Side(cfg, Path(tiny_model_dir), FrameState, tmp_path / "a", precheck=True)}
    times, _profiles, same = swap_host._drive(sides, swaps=12, seed=1, profile=None)
    assert same
    after = times["after"]
    assert len(after["apply_ms"]) == 12
    for whole, book, copy, rec in zip(after["apply_ms"], after["bookkeeping_ms"], after["kv_copy_ms"],
                                      after["recompute_ms"]):
        assert 0.0 <= book <= whole and abs(book + copy + rec - whole) < 1e-6
    assert sides["after"].state.last_swap.frames == sides["before"].state.last_swap.frames > 0
