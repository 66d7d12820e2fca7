"""A reconciler-like process for test_cuda_ipc.py: exports KV rows of its own CudaBackend by CUDA IPC.

Run as `python test/cuda_ipc_exporter.py MODEL_DIR CAPACITY OUT_DIR [KV_DTYPE [board]]` ("board": the exporter
keeps a host generation board in OUT_DIR/board, as with asr.host_generation_board). It fills slots with real K/V,
exports them (DeviceKvExporter), writes the expected rows to OUT_DIR/expected.npy and prints the
offer's IPC descriptor as one JSON line; then per stdin line: "export" exports the same slots again
(the ring's next free buffer) and prints the new descriptor; "protect [I ...]" protects those buffers from
the next exports, as the reconciler worker protects the one it handed out, and prints "ok"; "quit" exits.
"""
import json
import sys
from pathlib import Path

import numpy as np


def main() -> int:
    from vla_edge_ros.model.cuda_backend import CudaBackend
    from vla_edge_ros.model.cuda_state_transfer import DeviceKvExporter
    from vla_edge_ros.model.generation_board import GenerationBoard
    from vla_edge_ros.model.spec import ModelSpec

    model_dir, capacity, out_dir = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    kv_dtype = sys.argv[4] if len(sys.argv) > 4 else "float32"
    with_board = sys.argv[5:6] == ["board"]
    spec = ModelSpec.from_dir(model_dir)
    backend = CudaBackend(spec, model_dir, capacity, "float32", kv_dtype=kv_dtype)   # streamed from the directory
    rng = np.random.default_rng(5)
    slots = rng.permutation(capacity)[:150].astype(np.int32)          # scattered, more than one pass of rows
    x = rng.standard_normal((slots.size, spec.hidden_size)).astype(np.float32)
    for start in range(0, slots.size, backend.max_rows):
        end = min(slots.size, start + backend.max_rows)
        backend.forward(x[start:end], np.arange(start, end), slots[start:end], slots[:start], logits="none")
    np.save(f"{out_dir}/expected.npy", backend.read_kv(slots))
    buffers = 3
    board = None
    if with_board:
        Path(out_dir, "board").mkdir()
        board = GenerationBoard(buffers, Path(out_dir, "board"))
    exporter = DeviceKvExporter(backend, buffers, board=board)
    print(json.dumps(exporter(backend, slots).ipc_descriptor()), flush=True)
    for line in sys.stdin:
        if line.strip() == "export":
            print(json.dumps(exporter(backend, slots).ipc_descriptor()), flush=True)
        elif line.split()[:1] == ["protect"]:
            exporter.protect(int(i) for i in line.split()[1:])
            print("ok", flush=True)
        elif line.strip() == "quit":
            break
    exporter.close()
    backend.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
