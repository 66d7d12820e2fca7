"""`vla-edge compile-kernels`: PyCUDA's kernel cache filled ahead of the first node (issue 21's cold start).

On a machine without PyCUDA (CI) the command says so and exits 2; an unknown family is refused by name.
With a GPU (marker `gpu`) it compiles into PyCUDA's on-disk cache, which XDG_CACHE_HOME moves into a
temporary directory here: the cache gains the cubins, and the backend's own load of that family
afterwards finds them there (it adds nothing).
"""
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "vla_edge_ros.cli", "compile-kernels", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=600, env=env)


def _has_pycuda() -> bool:
    return importlib.util.find_spec("pycuda") is not None


@pytest.mark.skipif(_has_pycuda(), reason="PyCUDA is installed here")
def test_without_pycuda_it_says_so():
    out = _cli("--arch", "sm_90")
    assert out.returncode == 2 and "PyCUDA is not installed" in out.stderr, out.stderr


def test_a_job_count_below_one_is_refused_before_anything_compiles():
    out = _cli("--arch", "sm_90", "--jobs", "0")
    assert out.returncode == 2 and "--jobs must be at least 1" in out.stderr, out.stderr


@pytest.mark.skipif(not _has_pycuda(), reason="needs PyCUDA")
def test_an_unknown_family_is_refused_by_name():
    out = _cli("--arch", "sm_90", "--families", "argmax", "warp_drive")
    assert out.returncode == 2 and "warp_drive" in out.stderr, out.stderr


@pytest.mark.gpu
def test_it_fills_the_cache_the_backend_then_loads_from(tmp_path):
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path))
    out = _cli("--families", "argmax", "rmsnorm", "--kv-dtype", "float32", env=env)
    assert out.returncode == 0, out.stderr
    cached = sorted(p.name for p in tmp_path.rglob("*") if p.is_file())
    assert len(cached) >= 2, cached
    # A second process loading the same families, as a node's backend does, compiles nothing new.
    probe = ("from vla_edge_ros.model.cuda_device import primary_device\n"
             "from vla_edge_ros.model.cuda_kernels import compile_family\n"
             "d = primary_device(0)\n"
             "compile_family(d, 'argmax'); compile_family(d, 'rmsnorm')\n")
    loaded = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=300)
    assert loaded.returncode == 0, loaded.stderr
    assert sorted(p.name for p in tmp_path.rglob("*") if p.is_file()) == cached


def test_the_compile_lock_holds_a_second_process_until_the_first_is_done(tmp_path):
    """Two nodes configured side by side (lifecycle.parallel_configure), or a node and compile-kernels, fill
    PyCUDA's cache one at a time: fill_disk_cache holds a file lock across processes. A child process takes it and holds it; this one waits for it (without PyCUDA: the lock
    is plain Python)."""
    import time
    from vla_edge_ros.model import cuda_kernels
    env = dict(os.environ, TMPDIR=str(tmp_path))
    child = subprocess.Popen([sys.executable, "-c",
                              "import sys, time\n"
                              "from vla_edge_ros.model.cuda_kernels import _compile_lock\n"
                              "with _compile_lock():\n"
                              "    print('held', flush=True)\n"
                              "    time.sleep(1.5)\n"],
                             cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "held"
        import tempfile
        old = tempfile.tempdir
        tempfile.tempdir = str(tmp_path)
        try:
            t = time.monotonic()
            with cuda_kernels._compile_lock():
                waited = time.monotonic() - t
        finally:
            tempfile.tempdir = old
    finally:
        child.wait(timeout=10)
    assert 0.5 < waited < 5.0 and (tmp_path / cuda_kernels.COMPILE_LOCK_NAME).exists()
