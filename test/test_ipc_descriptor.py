"""IpcKV's offer descriptor is checked where the offer is loaded (the loader thread), not at the boundary. CPU:
building the holder maps nothing (IpcKvMapper.open does, through prepare)."""
import numpy as np
import pytest

from vla_edge_ros.model.cuda_ipc import DESCRIPTOR_KEYS, IpcKV


def _descriptor(**changes):
    d = {"handle": "00" * 64, "bytes": 4096, "header_offset": 4000, "generation": 3, "rows": 64,
         "shape": [2, 4, 400, 64], "element": "uint16", "finite": True}
    d.update(changes)
    return d


def test_a_descriptor_gives_the_rows_shape_and_the_arena_it_fits():
    kv = IpcKV(_descriptor(), mapper=None)
    assert kv.shape == (2, 4, 64, 64) and kv.generation == 3 and kv.all_finite()
    assert kv._arena_shape == (2, 4, 400, 64) and kv._element == np.dtype(np.uint16)


def test_a_bad_descriptor_is_refused_when_loaded():
    with pytest.raises(ValueError, match="lacks"):
        IpcKV({k: v for k, v in _descriptor().items() if k != "element"}, mapper=None)
    with pytest.raises(ValueError, match="not a numpy dtype"):
        IpcKV(_descriptor(element="bfloat17"), mapper=None)
    assert set(_descriptor()) == set(DESCRIPTOR_KEYS)
