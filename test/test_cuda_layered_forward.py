"""A forward run a few layers at a time on the CUDA backend (begin_layered / run_layer_piece): the K/V of one
forward, through the cycle's prefill kernels and through the bulk prefill, with the piece graphs captured ahead
(prepare_forward) and without graphs.

Not bit for bit: the prefill's split-K projections add their parts with atomics, so two whole forwards already
differ in the last bits (notes/cuda_notes.md, the persistent decode's tests). So each case measures that spread
itself: every backend gets the same context K/V (written, not recomputed), a second whole forward is compared with
the first, and the pieces may differ from the first by at most a few times that spread (plus a floor of 1e-6 of
the values' scale, for a path that happens to add in one order). The numpy backend's pieces are held to the
same bits (test_layered_forward.py).

GPU only (marker `gpu`).
"""
import numpy as np
import pytest

from kernel_compare import peak

pytestmark = pytest.mark.gpu
CAPACITY = 700
SPREADS = 4.0          # the pieces' deviation from a whole forward, in spreads of two whole forwards
FLOOR = 1e-6           # of the values' peak: the least deviation allowed


@pytest.fixture(scope="module", params=["tiny", "qwen2.5-1.5b-random"])
def model(request, tmp_path_factory):
    from vla_edge_ros.model.make_model import make_model
    from vla_edge_ros.model.spec import ModelSpec
    from vla_edge_ros.model.weights import load_weights
    layers = 5 if request.param.startswith("qwen2.5") else None
    path = make_model(request.param, tmp_path_factory.mktemp("layered"), seed=6, dtype="bf16", layers=layers)
    spec = ModelSpec.from_dir(path)
    return spec, load_weights(path, spec)


def _backend(model, **kw):
    from vla_edge_ros.model.cuda_backend import CudaBackend
    spec, weights = model
    return CudaBackend(spec, weights, CAPACITY, "bfloat16", kv_dtype="float32", **kw)


@pytest.mark.parametrize("rows, bulk", [(32, False), (200, True)])
@pytest.mark.parametrize("graphs", [True, False])
def test_pieces_write_the_bits_of_one_forward(model, rows, bulk, graphs):
    spec, _ = model
    kw = {"bulk_prefill_min_rows": 64 if bulk else 0, "bulk_prefill_max_rows": 512, "use_graphs": graphs}
    rng = np.random.default_rng(rows)
    slots = rng.permutation(CAPACITY).astype(np.int32)
    ctx, write = slots[:150], slots[150:150 + rows]
    ctx_x = rng.standard_normal((150, spec.hidden_size)).astype(np.float32)
    x = rng.standard_normal((rows, spec.hidden_size)).astype(np.float32)
    positions = np.arange(150, 150 + rows)
    for pieces in (1, 2, 3, spec.num_layers + 1):
        whole, again, split = _backend(model, **kw), _backend(model, **kw), _backend(model, **kw)
        if bulk and whole.bulk_min_rows == 0:
            pytest.skip("this model takes no bulk prefill")
        assert split.layered_rows_fit(rows)
        split.prepare_forward([rows], pieces=pieces)
        whole.forward(ctx_x, np.arange(150), ctx, np.zeros(0, np.int32), logits="none")
        ctx_kv = whole.read_kv(ctx)
        for b in (again, split):                    # the same context, so only the forward under test differs
            b.write_kv(ctx, ctx_kv)
        for b in (whole, again):
            b.forward(x, positions, write, ctx, logits="none")
        lf = split.begin_layered(x, positions, write, ctx, pieces)
        captured = len(split._graphs)
        while not split.run_layer_piece(lf):
            split.synchronize()                     # a gap between pieces: other host work, the device idle
            with pytest.raises(RuntimeError, match="in flight"):
                split.forward(x[:1], positions[:1], write[:1], ctx, logits="none")
        assert len(split._graphs) == captured, "a piece captured its graph while serving"
        expected = whole.read_kv(write)
        spread = float(np.abs(again.read_kv(write) - expected).max())
        bound = max(SPREADS * spread, FLOOR * peak(expected))
        deviation = float(np.abs(split.read_kv(write) - expected).max())
        assert deviation <= bound, (f"{rows} rows in {pieces} pieces: K/V off by {deviation:.3g}, two whole forwards "
                                    f"by {spread:.3g} (bound {bound:.3g})")
        for b in (whole, again, split):
            b.close()


def test_a_forward_that_takes_several_passes_is_not_run_in_pieces(model):
    b = _backend(model, bulk_prefill_min_rows=0, max_rows=32)
    spec, _ = model
    assert b.layered_rows_fit(32) and not b.layered_rows_fit(33)
    x = np.zeros((40, spec.hidden_size), np.float32)
    with pytest.raises(ValueError, match="fit one"):
        b.begin_layered(x, np.arange(40), np.arange(40), np.zeros(0, np.int32), 2)
    b.close()
