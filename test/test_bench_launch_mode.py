"""The decode launch modes the cycle benchmark and the decode profile accept (bench/pycuda_cycle.launch_mode)."""
import argparse

import pytest

from vla_edge_ros.bench.pycuda_cycle import LAUNCH_MODES, launch_mode


@pytest.mark.parametrize("text", ["plain", "pdl", "persistent", "persistent:1", "persistent:2:24", "persistent:1:0.5",
                                  "plain+mma", "plain+tiled", "pdl+mma2", "persistent:2+mma2", "plain+h2",
                                  "plain+mma2+h1", "pdl+h2+tiled", "plain+loop4", "plain+h2+loop2+mma2",
                                  "plain+kv16", "plain+kv32", "pdl+h1+kv16+loop4", "plain+int4staged",
                                  "pdl+int4staged+mma2+kv16", "plain+i4ipb2", "plain+i4ipb4", "plain+i4ipb8",
                                  "plain+i4ipb4+i4x2", "pdl+i4x2+i4ipb8+loop2+kv16", "plain+int4staged+i4ipb2",
                                  "plain+i4p1", "plain+int4unstaged", "plain+i4p1+i4ipb4+lcs2", "plain+g1+lcs4",
                                  "plain+h1+g1", "plain+i4pf", "plain+i4p1+i4pf", "plain+int4staged+i4pf"])
def test_launch_modes_that_parse(text):
    assert launch_mode(text) == text


@pytest.mark.parametrize("text", ["fast", "pdl:1", "persistent:3", "persistent:1:x", "persistent:1:-4",
                                  "persistent:1:2:3", "plain:", "plain+", "plain+fast", "plain+mma+tiled",
                                  "plain+mma+mma2", "plain+mma+mma", "plain+wide", "plain+h1+h2", "plain+h2+h2", "plain+loop2+loop4", "plain+loop3",
                                  "plain+kv16+kv32", "plain+kv16+kv16", "plain+kv8", "plain+pf16",
                                  "plain+int4staged+int4staged", "plain+i4x2", "plain+i4ipb2+i4ipb4",
                                  "plain+i4ipb3", "plain+i4ipb4+i4x2+i4x2", "plain+i4ipb16", "plain+i4p1+int4staged",
                                  "plain+i4p1+int4unstaged", "plain+i4p1+i4p1", "plain+g1+g1", "plain+i4pf+i4pf",
                                  "plain+int4unstaged+i4pf"])
def test_launch_modes_that_are_refused_with_the_syntax(text):
    with pytest.raises(argparse.ArgumentTypeError, match="plain, pdl or persistent"):
        launch_mode(text)


def test_a_mode_names_its_kv_arena_type_or_takes_the_default():
    from vla_edge_ros.bench.pycuda_cycle import mode_kv_dtype
    assert mode_kv_dtype("plain+h1+kv16", "float32") == "bfloat16"
    assert mode_kv_dtype("pdl+kv32", "bfloat16") == "float32"
    assert mode_kv_dtype("plain+mma2", "bfloat16") == "bfloat16"


def test_the_default_bench_times_every_mode():
    assert LAUNCH_MODES == ("plain", "pdl", "persistent")


class _PlanRecorder:
    """What kernel_lab.apply_launch_mode asks of a backend, without a GPU: the plan it switches to, returned as in
    effect except for what `cannot` names (a device without PDL, fp32 weights without the persistent kernel)."""

    def __init__(self, kv_dtype="float32", cannot=()):
        self.kv_dtype, self.cannot, self.plans = kv_dtype, cannot, []

    def use_kernel_plan(self, plan):
        import dataclasses
        self.plans.append(plan)
        return dataclasses.replace(plan, **{name: False for name in self.cannot})


@pytest.mark.parametrize("mode, in_effect, cannot", [
    ("plain", "plain", ()), ("pdl", "pdl", ()), ("pdl", "plain", ("programmatic_launch",)),
    ("persistent", "persistent", ()), ("persistent:1:24", "persistent:1:24", ()),
    ("persistent:2", "plain", ("persistent_decode",)), ("plain+tiled+h1", "plain+tiled+h1", ()),
    ("pdl+mma2+loop2+kv16", "pdl+mma2+loop2+kv16", ()), ("plain+mma+kv32", "plain+mma", ()),
    ("plain+mma2+h2", "plain+h2", ("tensor_core_attention",)),
    ("plain+int4staged", "plain+int4staged", ()),                            # an INT4 backend
    ("plain+int4staged+h1", "plain+h1", ("staged_int4_prefill_projections",)),  # float weights: forced off
    ("plain+i4ipb4+i4x2", "plain+i4ipb4+i4x2", ()),                            # an INT4 backend
])
def test_a_launch_mode_names_what_took_effect(mode, in_effect, cannot):
    from vla_edge_ros.bench.pycuda_cycle import apply_launch_mode
    assert apply_launch_mode(_PlanRecorder("bfloat16", cannot), mode) == in_effect


def test_a_launch_mode_plan_changes_only_what_it_names():
    import dataclasses
    from vla_edge_ros.bench import kernel_lab
    from vla_edge_ros.model.cuda_kernel_plan import MEASURED_BEST
    assert kernel_lab.mode_plan("plain") == MEASURED_BEST          # the serving plan: ordinary launches
    assert kernel_lab.mode_plan("pdl") == dataclasses.replace(MEASURED_BEST, programmatic_launch=True)
    assert kernel_lab.mode_plan("persistent:1:0.5+h1") == dataclasses.replace(
        MEASURED_BEST, persistent_decode=True, persistent_blocks_per_sm=1, persistent_l2_prefetch_bytes=1 << 19,
        decode_attention_head_split=1)
    assert kernel_lab.mode_plan("plain+tiled+noloop") == dataclasses.replace(
        MEASURED_BEST, tensor_core_attention=False, decode_gemv_blocks_per_sm=0)
    unstaged = dataclasses.replace(MEASURED_BEST, staged_prefill_projections=False)
    assert kernel_lab.mode_plan("pdl+mma", unstaged) == dataclasses.replace(
        unstaged, programmatic_launch=True, attention_blocks_per_sm=1)    # the base's other choices stay
    # From persistent back to plain: the decode steps launch again.
    recorder = _PlanRecorder()
    for mode in ("persistent", "plain"):
        kernel_lab.apply_launch_mode(recorder, mode)
    assert [p.persistent_decode for p in recorder.plans] == [True, False]


def test_a_float_backend_drops_the_int4_decode_grid_from_the_mode_in_effect():
    import dataclasses
    from vla_edge_ros.bench.pycuda_cycle import apply_launch_mode

    class _Float(_PlanRecorder):                 # use_kernel_plan as a float backend: the INT4 grid forced off
        def use_kernel_plan(self, plan):
            self.plans.append(plan)
            return dataclasses.replace(plan, int4_gemv_items_per_block=0, int4_gemv_rows_per_warp=1)
    assert apply_launch_mode(_Float("bfloat16"), "plain+i4ipb8+i4x2+h1") == "plain+h1"


def test_the_cycle_help_lists_every_kernel_variant(capsys):
    from vla_edge_ros.bench import pycuda_cycle
    from vla_edge_ros.bench.kernel_lab import KERNEL_VARIANTS
    with pytest.raises(SystemExit):
        pycuda_cycle.main(["--help"])
    text = capsys.readouterr().out
    missing = [v for v in KERNEL_VARIANTS if f"+{v}" not in text]
    assert not missing, f"pycuda_cycle --help names no {missing}"
