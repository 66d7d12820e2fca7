"""The cycle bench's weight formats without a GPU (bench/cycle_weights.py, bench/cycle_report.py, `--weights`,
`--shape llama-2-7b`) and the 7B INT4 preset (config/gpu_7b_int4.yaml).

What the GPU run does first is run here on the CPU with real files: the bench's HF model (bf16, random) written as an
INT4 snapshot, read back, the dequantized weights put into HF; the snapshot's function checked against HF holding
those weights. The report is printed from a result of both formats and its columns read back.
"""
import argparse

import numpy as np
import pytest

from vla_edge_ros import config as C
from vla_edge_ros.bench import cycle_report
from vla_edge_ros.bench import cycle_weights as cw
from vla_edge_ros.bench import pycuda_cycle as pc
from vla_edge_ros.model import int4
from vla_edge_ros.model.int4_snapshot import (PACKED_SUFFIX, SCALE_SUFFIX, int4_entries, projection_names,
                                              weight_format)
from vla_edge_ros.model.spec import ModelSpec
from vla_edge_ros.model.weights import SafetensorsFile, round_to_bf16, tensor_locations
from vla_edge_ros.resources import config_dir

GROUP = 32                     # divides tiny's 352 and llama-tiny's 96 / 128 / 256 (128 does not)
LLAMA_2_7B_PARAMETERS = 6_738_415_616


# ----------------------------------------------------------------------------
# Arguments


def _parser(add_arguments):
    p = argparse.ArgumentParser()
    add_arguments(p)
    return p


def test_the_bench_takes_weight_formats_and_the_7b_shape():
    from vla_edge_ros.tools import bench
    for p in (_parser(bench.add_arguments), _parser(pc.add_arguments)):
        args = p.parse_args(["--shape", "llama-2-7b", "--weights", "float", "int4"])
        assert args.weights == ["float", "int4"] and args.shape == "llama-2-7b"
        assert p.parse_args([]).weights == ["float"]                   # the default run is today's
        with pytest.raises(SystemExit):
            p.parse_args(["--weights", "int8"])
    with pytest.raises(SystemExit):
        _parser(pc.add_arguments).parse_args(["--shape", "llama-3-8b"])
    assert cw.check_formats(["int4", "float", "int4"]) == ["int4", "float"]
    with pytest.raises(ValueError, match="--weights"):
        cw.check_formats([])


def test_int4_weights_are_refused_outside_the_pycuda_cycle(capsys):
    from vla_edge_ros import cli
    assert cli.main(["bench", "--backend", "numpy", "--weights", "int4"]) == 2
    assert "--weights int4 is the pycuda cycle's" in capsys.readouterr().out


# ----------------------------------------------------------------------------
# The 7B shape and its floor


def test_the_7b_shape_is_llama_2_7b_and_its_robot_runs_the_7b_preset():
    model = pc._hf_skeleton("llama-2-7b", "meta", "bfloat16", "eager")        # no memory: shapes only
    assert type(model.config).__name__ == "LlamaConfig"
    assert sum(p.numel() for p in model.parameters()) == LLAMA_2_7B_PARAMETERS   # the published count
    spec = ModelSpec.from_hf_config({**model.config.to_dict(), "model_type": model.config.model_type})
    assert (spec.num_layers, spec.hidden_size, spec.num_heads, spec.num_kv_heads, spec.intermediate_size,
            spec.vocab_size, spec.tie_word_embeddings, spec.qkv_bias) == (32, 4096, 32, 32, 11008, 32000, False, False)
    robot = pc.robot_config("llama-2-7b")
    assert (robot.model.weights, robot.kv.dtype) == ("int4", "bfloat16")
    assert pc.robot_config("qwen2.5-1.5b").model.weights == "float"


def test_the_int4_decode_floor_of_the_7b_shape():
    spec = ModelSpec.from_hf_config(pc.hf_config("llama-2-7b"))
    per_layer = 4 * 4096 * 4096 + 3 * 4096 * 11008                   # q, k, v, o; gate, up, down
    assert cw.projection_weights(spec) == per_layer
    # 4.125 bits a weight at groups of 128; fp32 RMSNorm weights (two a layer); 256 bf16 head rows
    want = 32 * per_layer * 4.125 / 8 + 32 * 2 * 4096 * 4 + 256 * 4096 * 2
    assert cw.int4_decode_stream_bytes(spec, 128, 256) == want == 3_342_336_000


# ----------------------------------------------------------------------------
# The INT4 copy of the bench's weights


@pytest.fixture(scope="module", params=["tiny", "llama-tiny"])      # q/k/v bias and a tied head; neither
def int4_copy(request, tmp_path_factory):
    import torch
    torch.manual_seed(3)
    hf, cfg = pc._hf_model(request.param, device="cpu", dtype="bfloat16")
    spec = ModelSpec.from_hf_config(cfg)
    original = dict(cw.hf_float_weights(hf, spec).named_tensors())
    out = cw.write_int4_copy(tmp_path_factory.mktemp(request.param), cfg, spec, cw.hf_read_float(hf), GROUP)
    return request.param, hf, cfg, spec, original, out


def _stored(model_dir, name):
    return SafetensorsFile(tensor_locations(model_dir)[name]).read_stored(name)[0]


def test_the_copy_is_an_int4_snapshot_of_the_float_weights(int4_copy):
    _, _, _, spec, original, out = int4_copy
    assert weight_format(out) == "int4"
    assert set(int4_entries(out, spec)) == set(original)              # every tensor, headers and shapes checked
    quantized = set(projection_names(spec))
    dequantized = dict(cw.dequantized_float_weights(out, spec).named_tensors())
    for name, w in original.items():
        if name not in quantized:
            np.testing.assert_array_equal(dequantized[name], w, err_msg=name)   # bf16 values, stored as BF16
            continue
        packed = _stored(out, name.removesuffix(".weight") + PACKED_SUFFIX)
        scales = _stored(out, name.removesuffix(".weight") + SCALE_SUFFIX)
        want_packed, want_scales = int4.quantize(w, GROUP)
        np.testing.assert_array_equal(packed, want_packed, err_msg=name)
        np.testing.assert_array_equal(scales, want_scales, err_msg=name)
        np.testing.assert_array_equal(dequantized[name], int4.dequantize(packed, scales), err_msg=name)
        assert np.abs(dequantized[name] - w).max() > 0                   # quantized: not the float weights


def test_the_projection_bytes_on_disk_are_the_int4_floor_s_count(int4_copy):
    _, _, _, spec, _, out = int4_copy
    on_disk = sum(_stored(out, name.removesuffix(".weight") + suffix).nbytes
                  for name in projection_names(spec) for suffix in (PACKED_SUFFIX, SCALE_SUFFIX))
    assert on_disk == int4.device_bytes(spec.num_layers * cw.projection_weights(spec), GROUP)


def test_hf_holds_the_dequantized_weights_rounded_to_bf16(int4_copy):
    _, hf, _, spec, _, out = int4_copy
    weights = cw.dequantized_float_weights(out, spec)
    assert weights.int4_names == frozenset()                          # plain float weights for ours bf16
    cw.load_into_hf(hf, weights)
    params = dict(hf.named_parameters())
    for name, w_hat in weights.named_tensors():
        np.testing.assert_array_equal(params[name].float().detach().numpy(), round_to_bf16(w_hat), err_msg=name)


def test_hf_on_the_dequantized_weights_computes_the_int4_snapshot_s_function(int4_copy):
    # Every column of the bench on one function: the numpy backend running the snapshot (model.weights int4)
    # against HF in fp32 holding the dequantized weights.
    import torch

    from vla_edge_ros.model import hf_oracle
    from vla_edge_ros.model.factory import create_backend
    shape, _, _, spec, _, out = int4_copy
    hf32, _ = pc._hf_model(shape, device="cpu", dtype="float32")
    cw.load_into_hf(hf32, cw.dequantized_float_weights(out, spec))
    ids = np.random.default_rng(0).integers(0, spec.vocab_size, size=24)
    backend = create_backend("numpy", out, capacity=ids.size, weights="int4")
    n = np.arange(ids.size)
    ours = backend.forward(backend.embed(ids), n, n, np.zeros(0, np.int64), logits="all").logits
    with torch.no_grad():
        theirs = hf_oracle.hf_forward(hf32, ids).logits
    np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=2e-5)
    assert np.abs(theirs).max() > 1e-3                                 # logits that say something


def test_hf_weight_bytes_counts_a_tied_head_once(int4_copy):
    _, hf, _, spec, original, _ = int4_copy
    assert cw.hf_weight_bytes(hf) == 2 * sum(w.size for w in original.values())     # bf16, each tensor once


# ----------------------------------------------------------------------------
# The report of a run with both formats


class _Ours:
    """What the report reads of a backend."""

    def __init__(self, memory: int, stream: int, kv_dtype: str = "bfloat16"):
        self.memory, self.stream, self.kv_dtype, self.weight_bytes = memory, stream, kv_dtype, memory // 2

    def memory_bytes(self):
        return self.memory

    def decode_stream_bytes(self, n_bins):
        return self.stream + n_bins


def _timings(p50, p99, prefill, dec):
    return {"cycle_ms": {"p50": p50, "p99": p99}, "prefill_ms": prefill, "decode_ms_per_token": dec, "cycles": 5,
            "breakdown_ms": {}}


def _two_format_run():
    bandwidth = 4e12
    floors = {"float": 3_100_000_000, "int4": 900_000_000}
    eager, compiled = _timings(250.0, 300.0, 40.0, 25.0), {**_timings(30.0, 31.0, 5.0, 3.0), "compile_s": 70.0}
    ours = {"float": _timings(10.0, 12.0, 3.0, 0.8), "int4": _timings(8.0, 9.0, 3.0, 0.5)}
    rows = [cycle_report.row(4064, fmt, "plain", ours[fmt], eager, compiled, floors[fmt] / bandwidth * 1e3)
            for fmt in ("float", "int4")]
    backends = {("float", "bfloat16"): _Ours(20 * 2**30, 1), ("int4", "bfloat16"): _Ours(8 * 2**30, 2)}
    head = {"benchmark": "pycuda_cycle", "shape": "llama-2-7b", "machine": {"gpu_pycuda": "NVIDIA H200"},
            "cycle": "c", "kv_capacity": 4104, "robot_preset": "config/gpu_7b_int4.yaml"}
    return cycle_report.result(head, ["float", "int4"], ["plain"], ["bfloat16"], backends, rows, floors, bandwidth,
                               13_500_000_000, 256)


def _table(text: str, title_start: str) -> list[dict]:
    """The rows of a print_table table, as header -> cell."""
    lines = text.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith(title_start))
    headers = lines[at + 1].split("  ")
    headers = [h.strip() for h in headers if h.strip()]
    out = []
    for line in lines[at + 3:]:
        cells = line.split()
        if len(cells) != len(headers):
            break
        out.append(dict(zip(headers, cells)))
    return out


def test_the_report_of_both_formats_prints_their_ratios_and_floors_from_the_numbers(capsys):
    r = _two_format_run()
    cycle_report.print_report(r)
    out = capsys.readouterr().out
    rows = {row["weights"]: row for row in _table(out, "pycuda cycle")}
    assert "on NVIDIA H200" in out and "dequantized weights" in out
    assert rows["float"]["x eager p50"] == "25.000" and rows["int4"]["x eager p50"] == "31.250"      # 250 / ours
    assert rows["float"]["x compiled p99"] == "2.583" and rows["int4"]["x compiled p99"] == "3.444"  # 31 / ours
    # decode ms per token over the floor: 0.8 / (3.1 GB at 4 TB/s) and 0.5 / (0.9 GB at 4 TB/s)
    assert rows["float"]["dec/floor"] == "1.032" and rows["int4"]["dec/floor"] == "2.222"
    assert "ours float: decode floor 3.100 GB -> 0.775 ms/token" in out
    assert "ours  int4: decode floor 0.900 GB -> 0.225 ms/token" in out
    assert "HF bf16: all weights 13.500 GB -> 3.375 ms/token" in out
    assert "bfloat16 KV arena; robot preset config/gpu_7b_int4.yaml" in out
    # The JSON: every row with its format; the top level is the first format's, by_weights each one's.
    assert [c["weights"] for c in r["cycles"]] == ["float", "int4"]
    assert r["ratio"] == 25.0 and r["by_weights"]["int4"]["ratio"] == 31.25
    assert r["by_weights"]["int4"]["floor_decode_ms"] == pytest.approx(0.225)
    assert r["by_weights"]["int4"]["device_memory_bytes_by_kv_dtype"] == {"bfloat16": 8 * 2**30}


def test_a_float_only_report_keeps_its_columns():
    r = _two_format_run()
    r["weights"], r["cycles"] = ["float"], r["cycles"][:1]
    import contextlib
    import io
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        cycle_report.print_report(r)
    rows = _table(buf.getvalue(), "pycuda cycle")
    assert len(rows) == 1 and "weights" not in rows[0] and rows[0]["launch"] == "plain"
    assert "decode floor 3.100 GB -> 0.775 ms/token" in buf.getvalue()


# ----------------------------------------------------------------------------
# The 7B INT4 preset


SCRATCH_GIB = 0.5      # CudaBackend's plan at 7B besides weights and arena: the 1024-row bulk buffers, logits, ...


def test_the_7b_int4_preset_loads_names_int4_and_fits_its_ceiling():
    from vla_edge_ros.model.make_model import SYNTHETIC_SHAPES, synthetic_config
    cfg = C.load(config_dir() / "gpu_7b_int4.yaml")
    assert (cfg.model.path, cfg.model.backend, cfg.model.dtype, cfg.model.weights) == \
        ("models/llama-2-7b-int4", "pycuda", "bfloat16", "int4")
    assert (cfg.kv.capacity_tokens, cfg.kv.dtype, cfg.asr.backend) == (4096, "bfloat16", "pycuda")
    spec = ModelSpec.from_hf_config(synthetic_config(SYNTHETIC_SHAPES["llama-2-7b-random"], "bfloat16", "x", 0, 256))
    weights = (int4.device_bytes(spec.num_layers * cw.projection_weights(spec), cfg.model.int4_group_size)
               + 2 * spec.vocab_size * spec.hidden_size * 2)                       # + bf16 embedding and head
    arena = {kv: spec.kv_bytes_per_token(C.KV_ELEMENT_BYTES[kv]) * cfg.kv.capacity_tokens for kv in C.KV_DTYPES}
    scratch = SCRATCH_GIB * 2**30
    assert weights + arena[cfg.kv.dtype] + scratch < cfg.memory.vram_ceiling_bytes      # one process fits
    assert weights + arena["float32"] + scratch > cfg.memory.vram_ceiling_bytes         # why the arena is bf16


def test_the_nodes_cuda_backends_take_the_configured_ceiling():
    import inspect

    from vla_edge_ros.core.engine_factory import backend_options
    from vla_edge_ros.model.cuda_backend import CudaBackend
    default = inspect.signature(CudaBackend.__init__).parameters["vram_ceiling_bytes"].default
    assert default == C.MemoryConfig().vram_ceiling_bytes              # benches and tests without a config: one truth
    cfg = C.load(config_dir() / "gpu_7b_int4.yaml").replace({"memory.vram_ceiling_gib": 20.0})
    assert backend_options(cfg) == {**cfg.model.kernel_options(), "vram_ceiling_bytes": 20 * 2**30}


def test_a_rows_decode_is_set_against_its_weights_and_against_weights_and_kv():
    """At 4064 cached a decode step of the 7B INT4 also reads ~2.15 GB of K/V beside 3.34 GB of weights: its floor
    with the K/V is printed beside the weights-only one, with the cycles each side timed."""
    from vla_edge_ros.bench import cycle_report
    ours = {"cycle_ms": {"p50": 40.0, "p99": 41.0}, "prefill_ms": 10.0, "decode_ms_per_token": 2.6, "cycles": 20,
            "breakdown_ms": {}}
    eager = {"cycle_ms": {"p50": 200.0, "p99": 210.0}, "cycles": 10}
    r = cycle_report.row(4064, "int4", "plain", ours, eager, None, 0.79, 1.30)
    assert r["decode_vs_floor"] == pytest.approx(2.6 / 0.79) and r["decode_vs_floor_with_kv"] == pytest.approx(2.0)
    assert r["cycles_timed"] == 20 and r["hf_cycles_timed"] == 10
    assert cycle_report.row(4064, "int4", "plain", ours, eager, None, 0.79)["decode_vs_floor_with_kv"] is None
