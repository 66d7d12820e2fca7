"""A snapshot's KV crossing processes by CUDA IPC, as between the reconciler and reasoning nodes.

GPU only (marker `gpu`). A second process (test/cuda_ipc_exporter.py) builds
its own CudaBackend, computes real K/V and exports it into its ring buffer;
this process maps the buffer through the offer's descriptor and writes the
rows into its own arena with one kernel: they must be bit-identical to the
exporter's, and a buffer the exporter has since rewritten must be refused.
"""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.gpu
CAPACITY = 400
ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("kv_dtype, board", [("float32", False), ("bfloat16", False), ("float32", True)])
def test_kv_rows_cross_processes_bit_exactly_and_a_rewritten_buffer_is_refused(tiny_model_dir, tmp_path, kv_dtype,
                                                                              board):
    """board: the exporter keeps a host generation board (asr.host_generation_board) and the boundary's check
    reads it; the copy's device-side checks are the same either way."""
    from vla_edge_ros.model.cuda_backend import CudaBackend
    from vla_edge_ros.model.cuda_device import primary_device
    from vla_edge_ros.model.cuda_ipc import IpcKvMapper
    from vla_edge_ros.model.errors import DeviceKVUnavailable
    from vla_edge_ros.model.spec import ModelSpec

    child = subprocess.Popen([sys.executable, str(ROOT / "test" / "cuda_ipc_exporter.py"), str(tiny_model_dir),
                              str(CAPACITY), str(tmp_path), kv_dtype] + (["board"] if board else []),
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True, cwd=ROOT)
    try:
        descriptor = json.loads(child.stdout.readline())
        expected = np.load(tmp_path / "expected.npy")                  # [2, L, 150, kv_dim]
        spec = ModelSpec.from_dir(tiny_model_dir)
        primary = CudaBackend(spec, tiny_model_dir, CAPACITY, "float32", kv_dtype=kv_dtype)
        mapper = IpcKvMapper(primary.device)
        kv = mapper.open(descriptor)
        assert kv.shape == expected.shape and np.isfinite(kv).all()
        assert kv.checks_on_host == board and ("generation_board" in descriptor) == board
        dst = np.arange(CAPACITY - 1, CAPACITY - 151, -1)             # other slots, reversed
        write = kv.start_write(primary, dst)
        write.finish()
        np.testing.assert_array_equal(primary.read_kv(dst), expected)
        # The queuing's parts a swap reports: the scatter's launch, and of that its slot list's upload.
        assert 0.0 <= write.slot_upload_ms <= write.scatter_queue_ms <= kv.last_copy_ms
        assert descriptor["element"] == np.dtype(primary.kv_rows_dtype()).name
        other = dict(descriptor, element="float32" if kv_dtype == "bfloat16" else "uint16")
        with pytest.raises(ValueError, match="kv.dtype differs"):
            mapper.open(other).write_into(primary, dst)                # never converted, never copied
        print(f"150 KV rows across processes: {kv.last_copy_ms:.3f} ms (check, one kv_scatter, sync, check)")

        def ask(line):
            child.stdin.write(line + "\n")
            child.stdin.flush()
            answer = child.stdout.readline()
            return answer.strip() if answer.strip() == "ok" else json.loads(answer)

        # The reconciler worker protects the buffer of the offer it handed out: fresher exports go elsewhere.
        assert ask(f"protect {descriptor['buffer']}") == "ok"
        others = [ask("export") for _ in range(4)]
        assert all(d["buffer"] != descriptor["buffer"] for d in others), others
        kv.check_usable()
        kv.write_into(primary, dst)
        np.testing.assert_array_equal(primary.read_kv(dst), expected)
        assert ask("protect") == "ok"                                  # released: the ring comes back to it
        newer = ask("export")
        assert newer["handle"] == descriptor["handle"] and newer["generation"] == descriptor["generation"] + 1
        with pytest.raises(DeviceKVUnavailable, match="moved on"):
            kv.check_usable()
        with pytest.raises(DeviceKVUnavailable):
            kv.write_into(primary, dst)
        fresh = mapper.open(newer)
        fresh.write_into(primary, dst)
        np.testing.assert_array_equal(primary.read_kv(dst), expected)
        assert mapper.opened == 1, "a ring buffer offered again is not mapped again"
        if board:                       # a closed exporter's board reads every offer stale; the mapping stays valid
            fresh.check_usable()
            mapper.forget(set())        # the IPC mappings closed before their exporter frees them (CUDA's order)
            child.stdin.write("quit\n")
            child.stdin.flush()
            assert child.wait(timeout=60) == 0
            assert not (tmp_path / "board").exists(), "the exporter's close left its board"
            with pytest.raises(DeviceKVUnavailable, match="host generation board -1"):
                fresh.check_usable()
        mapper.close()
        freed = primary.close()
        assert freed > 0
        with primary_device(0).bound():
            pass                                                       # the context is still usable
    finally:
        if child.poll() is None:
            child.stdin.write("quit\n")
            child.stdin.flush()
        assert child.wait(timeout=60) == 0


def test_a_restarted_reconcilers_buffers_replace_the_old_mappings(tiny_model_dir, tmp_path):
    """The reconciler killed and started again: its successor's ring buffers have new handles at the same indices;
    the reasoning process closes the dead one's mappings as the new ones come, instead of holding them for good."""
    from vla_edge_ros.model.cuda_backend import CudaBackend
    from vla_edge_ros.model.cuda_ipc import IpcKvMapper
    from vla_edge_ros.model.spec import ModelSpec

    spec = ModelSpec.from_dir(tiny_model_dir)
    primary = CudaBackend(spec, tiny_model_dir, CAPACITY, "float32")
    mapper = IpcKvMapper(primary.device)
    dst = np.arange(CAPACITY - 1, CAPACITY - 151, -1)
    children = []
    try:
        for generation in ("first", "second"):
            out = tmp_path / generation
            out.mkdir()
            child = subprocess.Popen([sys.executable, str(ROOT / "test" / "cuda_ipc_exporter.py"),
                                      str(tiny_model_dir), str(CAPACITY), str(out)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT)
            children.append(child)
            descriptor = json.loads(child.stdout.readline())
            kv = mapper.open(descriptor)
            kv.write_into(primary, dst)
            np.testing.assert_array_equal(primary.read_kv(dst), np.load(out / "expected.npy"))
            if generation == "first":
                child.kill()                                           # SIGKILL: no close, as a crash
                child.wait(timeout=60)
        assert mapper.opened == 2 and mapper.retired == 1, (mapper.opened, mapper.retired)
        assert list(mapper._open) == [descriptor["handle"]], "the dead reconciler's buffer is still mapped"
        mapper.close()
        assert primary.close() > 0
    finally:
        for child in children:
            if child.poll() is None:
                child.stdin.write("quit\n")
                child.stdin.flush()
                child.wait(timeout=60)
