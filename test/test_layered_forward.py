"""A forward run a few layers at a time (model/layered_forward.py): the same bits as one forward.

CPU: the numpy backend, the tiny model (2 layers) and a 4-layer llama-tiny, pieces of every size; the CUDA
backend's piece graphs are test_cuda_layered_forward.py's.
"""
import numpy as np
import pytest

from vla_edge_ros.model.layered_forward import layer_pieces
from vla_edge_ros.model.make_model import make_model
from vla_edge_ros.model.numpy_backend import NumpyBackend
from vla_edge_ros.model.spec import ModelSpec
from vla_edge_ros.model.weights import load_weights

CAPACITY = 256


@pytest.fixture(scope="module", params=["tiny", "llama-tiny"])
def model(request, tmp_path_factory):
    out = tmp_path_factory.mktemp("layered") / request.param
    make_model(request.param, out)
    spec = ModelSpec.from_dir(out)
    return spec, load_weights(out, spec)


def test_layer_pieces_cover_every_layer_once_in_order():
    assert layer_pieces(28, 3) == [(0, 10), (10, 19), (19, 28)]
    assert layer_pieces(28, 1) == [(0, 28)]
    assert layer_pieces(2, 5) == [(0, 1), (1, 2)]                # at most one piece per layer
    for layers in (1, 2, 7, 28, 32):
        for pieces in (1, 2, 3, 4, 9):
            runs = layer_pieces(layers, pieces)
            assert [a for a, _ in runs] == [0] + [b for _, b in runs[:-1]] and runs[-1][1] == layers
            assert max(b - a for a, b in runs) - min(b - a for a, b in runs) <= 1
    with pytest.raises(ValueError):
        layer_pieces(28, 0)


def _inputs(spec, rng, context, rows):
    x = rng.standard_normal((rows, spec.hidden_size)).astype(np.float32)
    slots = rng.permutation(CAPACITY)
    return x, np.arange(context, context + rows), slots[context:context + rows], slots[:context]


@pytest.mark.parametrize("kv_dtype", ["float32", "bfloat16"])
def test_a_forward_run_piece_by_piece_writes_the_bits_of_one_forward(model, kv_dtype):
    spec, weights = model
    rng = np.random.default_rng(3)
    ctx_x, ctx_pos, ctx_slots, _ = _inputs(spec, rng, 0, 40)
    x, positions, write, _ = _inputs(spec, rng, 40, 24)
    write = np.setdiff1d(np.arange(CAPACITY), ctx_slots)[:24]
    for pieces in range(1, spec.num_layers + 2):
        whole, split = (NumpyBackend(spec, weights, CAPACITY, "float32", kv_dtype=kv_dtype) for _ in range(2))
        for b in (whole, split):
            b.forward(ctx_x, ctx_pos, ctx_slots, np.zeros(0, np.int32), logits="none")
        whole.forward(x, positions, write, ctx_slots, logits="none")
        lf = split.begin_layered(x, positions, write, ctx_slots, pieces)
        assert lf.pieces_left == min(pieces, spec.num_layers) and not np.array_equal(
            whole.read_kv(write), split.read_kv(write)), "nothing runs before the first piece"
        runs = 0
        while not split.run_layer_piece(lf):
            runs += 1
            with pytest.raises(RuntimeError, match="in flight"):
                split.forward(x[:1], positions[:1], write[:1], ctx_slots, logits="none")
        assert runs + 1 == min(pieces, spec.num_layers)
        np.testing.assert_array_equal(whole.read_kv(write), split.read_kv(write))
        # Done: the backend serves other forwards again, attending to what the pieces wrote as to the whole's.
        nxt = rng.standard_normal((1, spec.hidden_size)).astype(np.float32)
        more = np.setdiff1d(np.arange(CAPACITY), np.concatenate([ctx_slots, write]))[:1]
        context = np.concatenate([ctx_slots, write])
        a = whole.forward(nxt, np.array([64]), more, context).logits
        b = split.forward(nxt, np.array([64]), more, context).logits
        np.testing.assert_array_equal(a, b)


def test_a_forward_in_flight_can_be_given_up(model):
    spec, weights = model
    rng = np.random.default_rng(4)
    x, positions, write, context = _inputs(spec, rng, 0, 8)
    backend = NumpyBackend(spec, weights, CAPACITY, "float32")
    lf = backend.begin_layered(x, positions, write, context, 2)
    backend.run_layer_piece(lf)
    with pytest.raises(RuntimeError, match="in flight"):
        backend.begin_layered(x, positions, write, context, 2)
    with pytest.raises(RuntimeError, match="in flight"):      # refused as on the GPU, where it uses the residual
        backend.embed(np.array([1, 2]))
    backend.abandon_layered(lf)
    with pytest.raises(RuntimeError, match="not the forward in flight"):
        backend.run_layer_piece(lf)
    backend.forward(x, positions, write, context, logits="none")       # serves again
