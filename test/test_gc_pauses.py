"""The collector's pauses are counted per generation, and the configure-time collection can be left out."""
import gc

from vla_edge_ros.core import gc_pauses


def test_collections_are_counted_and_reset_forgets_them():
    pauses = gc_pauses.GcPauses().install()
    try:
        gc.collect()                                         # a full collection, as freeze() runs one
        summary = pauses.summary()
        assert summary["full_collections"] >= 1 and summary["max_full_pause_ms"] > 0.0
        pauses.reset(frozen_objects=123)
        assert pauses.summary()["collections"] == 0 and pauses.summary()["max_pause_ms"] == 0.0
        assert pauses.summary()["frozen_objects"] == 123
        gc.collect(0)                                        # a young collection after the reset is counted
        assert pauses.summary()["collections"] >= 1 and pauses.summary()["full_collections"] == 0
    finally:
        pauses.uninstall()
    before = pauses.summary()["collections"]
    gc.collect()
    assert pauses.summary()["collections"] == before         # uninstalled: no longer watching


def test_freeze_moves_the_survivors_out_of_later_collections():
    try:
        frozen = gc_pauses.freeze()
        assert frozen > 0 and gc.get_freeze_count() == frozen
    finally:
        gc_pauses.unfreeze()
    assert gc.get_freeze_count() == 0
