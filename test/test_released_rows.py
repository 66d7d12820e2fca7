"""The released vision rows' store (core/released_rows.py): memory reserved at construction, rows copied in,
lent back to a swap's records as read-only views whose slots return when the views are garbage."""
import gc
import tracemalloc
import weakref

import numpy as np
import pytest

from vla_edge_ros.core.released_rows import ReleasedRows

ROWS, HIDDEN = 4, 64


def rows(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((ROWS, HIDDEN)).astype(np.float32)   # [rows, hidden]


def test_keeping_rows_copies_them_and_pins_nothing_the_frame_allocated():
    store = ReleasedRows(frames=3, rows_per_frame=ROWS, hidden=HIDDEN)
    original = rows(1)
    alive = weakref.ref(original)
    assert store.keep(7, original)
    del original
    gc.collect()
    assert alive() is None                                   # the frame's own block is free for the heap to reuse
    np.testing.assert_array_equal(store.lend(7), rows(1))


def test_keeping_allocates_nothing_after_construction():
    """The slab is the store's whole footprint: keeping twice its frames' rows adds no block of traced memory
    (with the test above: neither pinned nor allocated per frame)."""
    frames, hidden = 8, 1024                                 # 16 KiB blocks: well above the bookkeeping's ~1 KiB
    blocks = [np.full((ROWS, hidden), i, np.float32) for i in range(2 * frames)]
    store = ReleasedRows(frames=frames, rows_per_frame=ROWS, hidden=hidden)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i, block in enumerate(blocks):
            store.keep(i, block)
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert grown < blocks[0].nbytes                          # bookkeeping only, not a block per frame
    assert store.nbytes == 2 * frames * blocks[0].nbytes


def test_the_newest_frames_are_kept_oldest_out_first():
    store = ReleasedRows(frames=3, rows_per_frame=ROWS, hidden=HIDDEN)
    for fid in range(5):
        assert store.keep(fid, rows(fid))
    assert store.released == 3
    assert store.lend(0) is None and store.lend(1) is None
    for fid in (2, 3, 4):
        np.testing.assert_array_equal(store.lend(fid), rows(fid))


def test_a_lent_view_keeps_its_slot_until_it_is_garbage():
    """A swap's record holds the lent view: keeping many more frames meanwhile never writes over it; once the
    view is dropped its slot serves again."""
    store = ReleasedRows(frames=2, rows_per_frame=ROWS, hidden=HIDDEN)
    store.keep(100, rows(100))
    view = store.lend(100)
    assert not view.flags.writeable
    with pytest.raises(ValueError):
        view[0, 0] = 1.0
    for fid in range(20):                                    # the other slots cycle many times
        assert store.keep(fid, rows(fid))
    np.testing.assert_array_equal(view, rows(100))
    assert store.lent == 1 and store.lend(100) is None       # lent once: it left the released ones
    del view
    gc.collect()
    assert store.lent == 0


def test_rows_of_another_shape_are_not_kept_and_counted():
    store = ReleasedRows(frames=2, rows_per_frame=ROWS, hidden=HIDDEN)
    assert not store.keep(1, np.zeros((ROWS + 1, HIDDEN), np.float32))
    assert not store.keep(2, np.zeros((ROWS, HIDDEN), np.float64))
    assert not store.keep(3, None)
    assert store.not_kept == 2 and store.released == 0


def test_every_slot_lent_refuses_and_says_so(caplog):
    store = ReleasedRows(frames=1, rows_per_frame=ROWS, hidden=HIDDEN)
    held = []
    for fid in range(2):
        store.keep(fid, rows(fid))
        held.append(store.lend(fid))
    assert not store.keep(9, rows(9))
    assert store.not_kept == 1 and "no free slot" in caplog.text
    held.clear()
    gc.collect()
    assert store.keep(9, rows(9))


def test_sizes_must_be_positive():
    with pytest.raises(ValueError, match="positive sizes"):
        ReleasedRows(frames=0, rows_per_frame=ROWS, hidden=HIDDEN)
