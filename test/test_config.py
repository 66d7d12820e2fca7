"""config.py: the shipped YAML loads, and every kind of bad value is refused with the key named."""
import math
import textwrap

import pytest

from vla_edge_ros import config as C


def test_shipped_yaml_holds_the_design_defaults():
    cfg = C.load()
    assert cfg.cycle.deadline_ms == 33.0
    assert cfg.cycle.safety_margin_ms == 2.0
    assert cfg.vision.tokens_per_frame == 32
    assert (cfg.vision.image_width, cfg.vision.image_height) == (128, 64)
    assert cfg.action.num_tokens == 8 and cfg.action.num_bins == 256
    assert cfg.kv.capacity_tokens == 4096
    assert cfg.memory.vram_ceiling_bytes == 8 * 1024 ** 3
    assert cfg.admission.ema_alpha == 0.2
    assert cfg.kv.eviction_policy == "semantic"
    assert cfg.kv.dtype == "float32"             # the KV arena in fp32 unless a config asks for bf16
    # What a robot chooses of the pycuda backend, as CudaBackend takes it: the bulk prefill from 64 rows (where it
    # draws even). Its kernels are no setting: the measured-best KernelPlan.
    assert cfg.model.kernel_options() == {"bulk_prefill_min_rows": 64, "bulk_prefill_max_rows": 1024,
                                          "bulk_prefill_precision": "split"}


def test_yaml_and_dataclass_defaults_agree_so_there_is_one_truth():
    # The YAML is the source; the dataclass defaults must not silently disagree with it.
    assert C.load().flat() == C.VlaConfig().flat()


def test_every_key_has_a_description():
    docs = C.describe()
    assert set(docs) == set(C.VlaConfig().flat())
    assert all(docs.values()), [k for k, v in docs.items() if not v]


@pytest.mark.parametrize("override, fragment", [
    ({"cycle.deadline_ms": -5.0}, "cycle.deadline_ms"),
    ({"cycle.safety_margin_ms": 40.0}, "safety_margin_ms"),
    ({"kv.capacity_tokens": 40}, "kv.capacity_tokens"),
    ({"kv.eviction_policy": "lru"}, "kv.eviction_policy"),
    ({"kv.dtype": "float16"}, "kv.dtype"),
    ({"admission.ema_alpha": 0.0}, "admission.ema_alpha"),
    ({"action.dim_names": ["a", "b"]}, "action.dim_names"),
    ({"model.backend": "tpu"}, "model.backend"),
    ({"model.bulk_prefill_precision": "fp8"}, "model.bulk_prefill_precision"),
    ({"camera.reliability": "sometimes"}, "camera.reliability"),
    ({"asr.evict_fraction": 1.0}, "asr.evict_fraction"),
    ({"asr.backend": "gpu"}, "asr.backend"),
    ({"lifecycle.capacity_check_cycles": -1}, "lifecycle.capacity_check_cycles"),
    ({"lifecycle.capacity_budget_share": 0.0}, "lifecycle.capacity_budget_share"),
    ({"lifecycle.capacity_budget_share": 1.5}, "lifecycle.capacity_budget_share"),
    ({"asr.device": -2}, "asr.device"),
    ({"asr.semantic_trigger": "often"}, "asr.semantic_trigger"),
    ({"asr.round_fit_margin": 0.0}, "asr.round_fit_margin"),
    ({"asr.mode": "semantic", "asr.semantic_trigger": "fill", "asr.rebuild_fill": 0.9}, "must be below asr.threshold"),
    ({"asr.device": 1, "asr.backend": "numpy"}, "asr.backend is numpy"),
    ({"vision.grid_cols": 0}, "vision.grid_cols"),
    ({"cycle.executor": "multi_threaded"}, "cycle.executor"),
    ({"kv.recompute_headroom": 0.5}, "kv.recompute_headroom"),
])
def test_impossible_values_name_the_key(override, fragment):
    with pytest.raises(C.ConfigError, match=fragment.replace(".", r"\.")):
        C.load(overrides=override)


def test_kv_dtype_takes_each_allowed_value_and_names_them_when_refusing(tmp_path):
    f = tmp_path / "kv.yaml"
    f.write_text("kv:\n  dtype: bfloat16\n")
    assert C.load(f).kv.dtype == "bfloat16"
    assert C.load(overrides={"kv.dtype": "bfloat16"}).kv.dtype == "bfloat16"
    with pytest.raises(C.ConfigError, match=r"kv\.dtype must be one of \('float32', 'bfloat16'\), got 'bf16'"):
        C.load(overrides={"kv.dtype": "bf16"})


def test_unknown_key_and_unknown_section_are_refused(tmp_path):
    with pytest.raises(C.ConfigError, match=r"cycle\.deadline"):
        C.load(overrides={"cycle.deadline": 30.0})
    bad = tmp_path / "bad.yaml"
    bad.write_text("cycles:\n  deadline_ms: 33.0\n")
    with pytest.raises(C.ConfigError, match="cycles"):
        C.load(bad)


def test_wrong_types_are_refused_not_converted(tmp_path):
    f = tmp_path / "t.yaml"
    f.write_text("kv:\n  capacity_tokens: '4096'\n")
    with pytest.raises(C.ConfigError, match=r"kv\.capacity_tokens: expected int, got str"):
        C.load(f)
    f.write_text("cycle:\n  deterministic: 1\n")
    with pytest.raises(C.ConfigError, match=r"cycle\.deterministic: expected bool"):
        C.load(f)
    f.write_text("cycle:\n  deadline_ms: 20\n")      # an int where a float is meant is fine
    assert C.load(f).cycle.deadline_ms == 20.0


def test_plain_and_ros_parameter_files_load_the_same(tmp_path):
    plain = tmp_path / "plain.yaml"
    plain.write_text("cycle:\n  deadline_ms: 50.0\nkv:\n  eviction_policy: fifo\n")
    ros = tmp_path / "ros.yaml"
    ros.write_text(textwrap.dedent("""\
        /**:
          ros__parameters:
            cycle:
              deadline_ms: 50.0
        reasoning:
          ros__parameters:
            kv:
              eviction_policy: fifo
        """))
    assert C.load(plain) == C.load(ros)


def test_a_parameter_block_for_no_node_of_the_graph_is_refused(tmp_path):
    """ROS applies a block only to the node it names: a misspelled one was merged here as if it applied, while the
    running node ignored it silently (its deadline and capacity stayed the defaults)."""
    typo = tmp_path / "typo.yaml"
    typo.write_text("reasonig:\n  ros__parameters:\n    cycle: {deadline_ms: 50.0}\n")
    with pytest.raises(C.ConfigError, match="'reasonig' names no node of the graph"):
        C.load(typo)
    for key in ("/**", "reasoning", "/robot1/reasoning", "/**/camera_ingest", "reconciler"):
        ok = tmp_path / "ok.yaml"
        ok.write_text(f"{key}:\n  ros__parameters:\n    cycle: {{deadline_ms: 50.0}}\n")
        assert C.load(ok).cycle.deadline_ms == 50.0, key


@pytest.mark.parametrize("value", [".nan", ".inf", "-.inf"])
def test_a_number_that_is_not_finite_is_refused_by_name(tmp_path, value):
    """NaN passes every "must be >= 0" check (nan < 0 is false) and stopped the reasoning node at its first cycle;
    inf raised an OverflowError inside configure that no log line named."""
    bad = tmp_path / "bad.yaml"
    bad.write_text(f"/**:\n  ros__parameters:\n    cycle: {{safety_margin_ms: {value}}}\n")
    with pytest.raises(C.ConfigError, match="cycle.safety_margin_ms: must be a finite number"):
        C.load(bad)
    with pytest.raises(C.ConfigError, match="memory.vram_ceiling_gib: must be a finite number"):
        C.load(overrides={"memory.vram_ceiling_gib": {".nan": math.nan, ".inf": math.inf, "-.inf": -math.inf}[value]})


def test_missing_or_unreadable_file_is_a_config_error(tmp_path):
    with pytest.raises(C.ConfigError, match="cannot read"):
        C.load(tmp_path / "nope.yaml")
    broken = tmp_path / "broken.yaml"
    broken.write_text("cycle: [unclosed\n")
    with pytest.raises(C.ConfigError, match="cannot read"):
        C.load(broken)


def test_cpu_demo_preset_changes_only_what_it_says():
    preset = C.load(C.default_config_path().parent / "cpu_demo.yaml")
    base = C.load()
    changed = {k for k, v in preset.flat().items() if base.flat()[k] != v}
    assert changed == {"kv.capacity_tokens", "asr.threshold", "vision.grid_cols"}
    assert preset.asr.threshold < base.asr.threshold
    assert preset.vision.tokens_per_frame < base.vision.tokens_per_frame     # fewer rows per cycle
    assert preset.kv.capacity_tokens // preset.vision.tokens_per_frame >= 16   # still a real history of frames


def test_the_cuda_backend_defaults_are_the_configured_options_and_the_measured_best_plan():
    # Benches and tests that build a CudaBackend without a config get what a robot's config gives it: one truth.
    import inspect
    from vla_edge_ros.model.cuda_backend import CudaBackend
    from vla_edge_ros.model.cuda_kernel_plan import MEASURED_BEST
    params = inspect.signature(CudaBackend.__init__).parameters
    assert {k: params[k].default for k in C.ModelConfig().kernel_options()} == C.ModelConfig().kernel_options()
    assert params["plan"].default is MEASURED_BEST


@pytest.mark.parametrize("key", sorted(C.REMOVED_KEYS))
def test_a_removed_kernel_key_is_refused_naming_where_the_choice_lives_now(tmp_path, key):
    # Removed: the kernel choices only the bench varies. A YAML, a --set override or a ROS parameter file that still
    # sets one is told where the choice went, not merely that the key is unknown.
    sec, _, name = key.partition(".")
    path = tmp_path / "old.yaml"
    path.write_text(f"{sec}:\n  {name}: true\n")
    for load in (lambda: C.load(path), lambda: C.VlaConfig().replace({key: True})):
        with pytest.raises(C.ConfigError) as err:
            load()
        assert key in str(err.value)
        assert "cuda_kernel_plan.py" in str(err.value) and f"KernelPlan.{name}" in str(err.value)
        assert "bench/kernel_lab.py" in str(err.value)
    ros = tmp_path / "ros.yaml"
    ros.write_text(f"/**:\n  ros__parameters:\n    {sec}:\n      {name}: true\n")
    with pytest.raises(C.ConfigError, match="was removed"):
        C.load(ros)


def test_every_removed_key_names_a_field_of_the_kernel_plan():
    import dataclasses
    from vla_edge_ros.model.cuda_kernel_plan import KernelPlan
    fields = {f.name for f in dataclasses.fields(KernelPlan)}
    assert {key.partition(".")[2] for key in C.REMOVED_KEYS} <= fields
    assert not set(C.REMOVED_KEYS) & set(C.VlaConfig().flat())


def test_set_on_the_command_line_passes_a_whole_number_for_a_float_key_as_a_float():
    from vla_edge_ros.tools.bringup import parse_sets
    got = parse_sets(["asr.swap_poll_ms=100", "kv.capacity_tokens=1024", "asr.mode=semantic", "cycle.deadline_ms=50.5"])
    assert got == {"asr.swap_poll_ms": 100.0, "kv.capacity_tokens": 1024, "asr.mode": "semantic",
                   "cycle.deadline_ms": 50.5}
    assert type(got["asr.swap_poll_ms"]) is float and type(got["kv.capacity_tokens"]) is int
    C.load(overrides=got)                 # and the config takes them


def test_an_mmap_threshold_beyond_glibcs_range_is_refused():
    with pytest.raises(C.ConfigError, match="malloc_mmap_threshold_mib"):
        C.load(overrides={"memory.malloc_mmap_threshold_mib": 64.0})
