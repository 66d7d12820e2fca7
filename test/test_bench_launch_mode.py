"""The decode launch modes the cycle benchmark and the decode profile accept (bench/pycuda_cycle.launch_mode)."""
import argparse

import pytest

from vla_edge_ros.bench.pycuda_cycle import LAUNCH_MODES, launch_mode


@pytest.mark.parametrize("text", ["plain", "pdl", "persistent", "persistent:1", "persistent:2:24", "persistent:1:0.5",
                                  "plain+mma", "plain+tiled", "pdl+mma2", "persistent:2+mma2", "plain+h2",
                                  "plain+mma2+h1", "pdl+h2+tiled", "plain+loop4", "plain+h2+loop2+mma2",
                                  "plain+kv16", "plain+kv32", "pdl+h1+kv16+loop4"])
def test_launch_modes_that_parse(text):
    assert launch_mode(text) == text


@pytest.mark.parametrize("text", ["fast", "pdl:1", "persistent:3", "persistent:1:x", "persistent:1:-4",
                                  "persistent:1:2:3", "plain:", "plain+", "plain+fast", "plain+mma+tiled",
                                  "plain+mma+mma2", "plain+mma+mma", "plain+wide", "plain+h1+h2", "plain+h2+h2", "plain+loop2+loop4", "plain+loop3",
                                  "plain+kv16+kv32", "plain+kv16+kv16", "plain+kv8", "plain+pf16"])
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
