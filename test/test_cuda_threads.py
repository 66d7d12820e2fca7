"""CUDA context ownership by thread: how the nodes use the GPU (model/cuda_device.py).

GPU only (marker `gpu`). The reasoning node builds its backend on the executor
thread and runs cycles on its own cycle thread; the reconciler's worker and
the swap loader are further threads. On the H200 that first failed with
"invalid device context" (no context on the cycle thread) and then aborted at
exit ("context stack was not empty upon module cleanup"). Checked here:
a backend built on one thread serves every call from other threads that hold
no context, leaves none pushed behind, and a whole process doing that exits 0;
close() gives the device memory back.
"""
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[1]
CAPACITY = 32768        # a 64 MiB KV arena: big enough that the memory close() gives back shows in mem_get_info
BINS = 256
ALLOCATION_GRANULE = 2 << 20     # the driver reports free memory in pages of its allocator

SCRIPT = """
import sys, threading
import numpy as np
from vla_edge_ros.model.cuda_backend import CudaBackend
from vla_edge_ros.model.cuda_device import bound
from vla_edge_ros.model.spec import ModelSpec

spec = ModelSpec.from_dir(sys.argv[1])
backend = CudaBackend(spec, sys.argv[1], 256, "bfloat16")     # main thread: built, nothing left current
out = {}

def cycles():                                                  # as the reasoning node's cycle thread
    with bound(backend.device):
        for i in range(3):
            x = backend.embed(np.arange(12) + i)
            out[i] = backend.run_cycle_tokens(x, np.arange(12), np.arange(12), np.zeros(0, np.int32),
                                              np.arange(12, 19), np.arange(12, 19), spec.vocab_size - 256, 8, 256)

def reads():                                                   # a thread that never binds anything itself
    out["kv"] = backend.read_kv(np.arange(12))

for target in (cycles, reads):
    t = threading.Thread(target=target)
    t.start()
    t.join()
assert len(out) == 4, out
backend.close()
print("ok")
"""


def _cycle_args(spec, i):
    return (np.arange(12), np.arange(12), np.zeros(0, np.int32), np.arange(12, 19), np.arange(12, 19),
            spec.vocab_size - BINS, 8, BINS)


def test_a_backend_built_on_one_thread_serves_other_threads_and_leaves_no_context(tiny_model_dir):
    from vla_edge_ros.model.cuda_backend import CudaBackend
    from vla_edge_ros.model.cuda_device import current_handle, primary_device
    from vla_edge_ros.model.spec import ModelSpec

    spec = ModelSpec.from_dir(tiny_model_dir)
    device = primary_device(0)
    drv = device.drv
    built, seen, errors = {}, {}, []

    def run(name, work):
        try:
            seen[name + ":before"] = current_handle(drv)
            work()
            seen[name + ":after"] = current_handle(drv)
        except Exception as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(f"{name}: {type(exc).__name__}: {exc}")

    def build():
        built["b"] = CudaBackend(spec, tiny_model_dir, CAPACITY, "bfloat16")

    def cycle():
        b = built["b"]
        x = b.embed(np.arange(12))
        built["tokens"] = b.run_cycle_tokens(x, *_cycle_args(spec, 0))

    def kv():
        built["kv"] = built["b"].read_kv(np.arange(12))

    free_before = device.mem_info()[0]
    for name, work in (("build", build), ("cycle", cycle), ("kv", kv)):
        t = threading.Thread(target=run, args=(name, work))
        t.start()
        t.join()
    assert not errors, errors
    assert all(v is None for v in seen.values()), f"a thread was left with a context: {seen}"
    assert built["tokens"].shape == (8,) and (built["tokens"] >= spec.vocab_size - BINS).all()
    assert np.isfinite(built["kv"]).all()
    free_built = device.mem_info()[0]
    freed = built["b"].close()
    free_after = device.mem_info()[0]
    print(f"device free: {free_before / 2**20:.0f} MiB before, {free_built / 2**20:.0f} built, "
          f"{free_after / 2**20:.0f} after close ({freed / 2**20:.0f} MiB freed)")
    assert freed >= built["b"].planned_bytes * 0.9
    assert free_after - free_built >= freed - 4 * ALLOCATION_GRANULE, "close() did not give the device memory back"
    with pytest.raises(RuntimeError, match="closed"):
        built["b"].read_kv(np.arange(2))


def test_a_process_that_uses_the_gpu_from_threads_exits_cleanly(tiny_model_dir):
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(tiny_model_dir)], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stdout[-2000:] + done.stderr[-3000:]
    assert "context stack" not in done.stderr, done.stderr[-3000:]
