"""`python -m vla_edge_ros.bench.swap_host`: the host side of a swap at the cycle boundary, timed in parts.

A swap (FrameState.import_state, called by SwapClient.apply_ready) checks the
offered snapshot, moves its ~120 frames into the slot and frame bookkeeping,
copies its KV into the arena and recomputes the frames admitted since (late
frames). On the GPU the KV copy and the recompute are device work; the rest
(checks, slots, "rest") is Python and numpy on the cycle thread, and that is
what this benchmark measures, swap after swap, through the real path:
reconciler-side export and publish (a snapshot file), SwapClient's loader
(load_offer), then apply_ready at a boundary.

Set-up: the numpy backend of the tiny model (hidden 128, 4 layers) with the
robot's slot and frame counts: 4096 KV slots, semantic eviction, frames of
32 tokens, ~122 frames per snapshot, 0-2 late frames per swap, offers without
vision rows (asr.snapshot_rows false, the default). The offer's KV is held in
a device-like payload: its finiteness is taken once at export and the copy is
the host write_kv, as the GPU path takes it from the reconciler's export sum
(DeviceKV / IpcKV) rather than scanning rows at the boundary. Hidden size and
layer count enter only the KV copy, the recompute and the loader's unit
vectors; `--model` takes any snapshot directory to check that (e.g. a
one-layer 1.5B shape: `vla-edge make-model qwen2.5-1.5b-random --layers 1
--dtype float32 --out /tmp/q1`).

The baseline, measured in the same run on the same snapshots, is the same
code with every snapshot check at the boundary (as when the loader does not
pre-check an offer); both must end in the same slots and frames after every
swap, or the run says so and fails. The bookkeeping of commit 7bcc3f0 (a
free list of Python ints, a record built per frame, numpy medians at the
boundary) is the tests' oracle (test/slot_bookkeeping_before.py); this
benchmark ran it side by side at 13e9c99, on the 2-vCPU development machine:
bookkeeping p50 2.28 -> 1.15 ms (notes/cuda_notes.md, 2026-12-03 second session).
"""
from __future__ import annotations

import cProfile
import io
import logging
import pstats
import tempfile
import time
from pathlib import Path

import numpy as np

from ..config import load as load_config
from ..model.backend import HostKV
from .common import machine_info, module_main, percentiles, print_table, write_json

log = logging.getLogger(__name__)

PARTS = ("apply_ms", "check_ms", "place_ms", "kv_copy_ms", "recompute_ms", "rest_ms", "bookkeeping_ms")
# The profile lists the package's own functions and the builtins they call, not the numpy forward's insides.
PROFILE_FILTER = r"core/|bench/|\{|<"


class FlaggedKV(HostKV):
    """A snapshot's KV as a device payload presents it (model/backend.KvPayload): finiteness taken once at
    export, no scan at the boundary; the copy is HostKV's arena write (the GPU's kv_scatter stands here)."""

    on_device = True
    dtype = np.dtype(np.float32)

    def __init__(self, rows: np.ndarray, key: int):
        super().__init__(rows)                      # [2, layers, rows, kv_dim] float32
        self.finite = bool(np.isfinite(rows).all())
        self.key = key

    def all_finite(self) -> bool:
        return self.finite

    def ipc_descriptor(self) -> dict:
        return {"bench_key": self.key}


class _Side:
    """One primary (a FrameState and the SwapClient that feeds it) and the reconciler-side exporter."""

    def __init__(self, cfg, model_dir: Path, state_class, store_dir: Path, precheck: bool):
        from ..core.swap_protocol import SnapshotStore, SwapClient
        from ..model.factory import create_backend, load_model
        _spec, _weights, tokenizer = load_model(model_dir)
        backend = create_backend("numpy", model_dir, capacity=cfg.kv.capacity_tokens)
        self.state = state_class(cfg, backend, tokenizer)
        self.exported: dict[int, FlaggedKV] = {}
        self.state.kv_export = self._export
        self.store = SnapshotStore(store_dir)
        # precheck: the loader checks the snapshot before the boundary, as the reasoning node's does now.
        self.client = SwapClient(poll_period_s=0.0, request_timeout_s=10.0, open_device_kv=self._open,
                                 precheck=self.state.prepare_swap if precheck else None)

    def _export(self, backend, slots) -> FlaggedKV:
        key = len(self.exported) + 1
        self.exported = {key: FlaggedKV(backend.read_kv(slots), key)}     # the newest export only
        return self.exported[key]

    def _open(self, descriptor: dict) -> FlaggedKV:
        return self.exported[descriptor["bench_key"]]

    def load(self) -> None:
        """The exported offer through SwapClient's loader (off the boundary in the node: not timed)."""
        from ..core.swap_protocol import SwapAnswer
        self.client.request_sent()
        self.client.load_offer(self.client.on_response(SwapAnswer(self.pending), None))

    def export(self, version: int) -> None:
        snap = self.state.export_state(version=version, with_rows=self.state.cfg.asr.snapshot_rows)
        snap.round = version
        self.pending = self.store.publish(snap)


def _chunks(rng, n: int, first_id: int, tpf: int, hidden: int) -> list:
    from ..core.state_snapshot import StateChunk
    return [StateChunk(first_id + i, float(first_id + i) / 30.0,
                       rng.standard_normal((tpf, hidden)).astype(np.float32),     # [tpf, hidden] vision rows
                       rng.standard_normal(hidden).astype(np.float32))            # [hidden] pooled
            for i in range(n)]


def _fingerprint(state) -> tuple:
    """What two implementations must agree on after a swap: slots per frame, in order, and the frame records."""
    kv = state.kv
    return (tuple((r.frame_id, r.position_start, tuple(r.slots.tolist())) for r in kv.retained()),
            tuple(kv.free_stack().tolist()), tuple(sorted((f, rec.stamp_s, rec.tokens is not None) for f, rec in state.frames.items())),
            state.next_position, state.state_version, state.last_frame_id)


def _drive(sides: dict, swaps: int, seed: int, profile: str | None) -> tuple[dict, dict, bool]:
    """Runs every side through the same frames and swaps; returns ({side: {part: [ms]}}, {side: profile text},
    whether all sides agreed after every swap)."""
    rng = np.random.default_rng(seed)
    any_state = next(iter(sides.values())).state
    tpf, hidden = any_state.cfg.vision.tokens_per_frame, any_state.backend.spec.hidden_size
    fill = any_state.frame_capacity - 3
    first = _chunks(rng, fill, 0, tpf, hidden)
    for side in sides.values():
        side.state.append_chunks(first, allow_evict=True)
    times = {name: {p: [] for p in PARTS} for name in sides}
    profilers = {name: cProfile.Profile() for name in sides} if profile else {}
    next_id, same = fill, True
    for k in range(1, swaps + 1):
        late = _chunks(rng, int(rng.integers(0, 3)), next_id, tpf, hidden)
        next_id += len(late)
        prints = []
        for name, side in sides.items():
            side.export(k)
            for c in late:       # admitted between "ready" and "applied": recomputed over the snapshot
                side.state.append_chunks([c], allow_evict=True)
            side.load()
            prof = profilers.get(name)
            if prof is not None:
                prof.enable()
            outcome = side.client.apply_ready(side.state, cycle_id=k)
            if prof is not None:
                prof.disable()
            if outcome is None or outcome.status != "applied":
                raise RuntimeError(f"{name}: swap v{k} not applied: {outcome}")
            _note(times[name], side.client)
            prints.append(_fingerprint(side.state))
        same = same and all(p == prints[0] for p in prints[1:])
        new = _chunks(rng, 1, next_id, tpf, hidden)           # a cycle between swaps: one frame, policy evicts
        next_id += 1
        for side in sides.values():
            side.state.append_chunks(new, allow_evict=True)
    texts = {}
    for name, prof in profilers.items():
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats(profile).print_stats(PROFILE_FILTER, 30)
        texts[name] = out.getvalue()
    return times, texts, same


def _note(into: dict, client) -> None:
    """The parts of the swap the client just applied, as SwapClient.mark_applied recorded them (the rest and the
    bookkeeping derived there, once)."""
    for part in PARTS:
        into[part].append(client.timings[part][-1])


def run(args) -> int:
    from ..core.engine_state import FrameState
    model_dir = Path(args.model) if args.model else Path(load_config().model.path)
    _ensure_model(model_dir)
    cfg = load_config(overrides={"model.path": str(model_dir), "model.backend": "numpy",
                                 "kv.capacity_tokens": args.capacity, "cycle.deterministic": True})
    with tempfile.TemporaryDirectory(prefix="swap_host_") as tmp:
        sides = {"before": _Side(cfg, model_dir, FrameState, Path(tmp) / "before", precheck=False),
                 "after": _Side(cfg, model_dir, FrameState, Path(tmp) / "after", precheck=True)}
        spec = sides["after"].state.backend.spec
        t0 = time.perf_counter()
        times, profiles, same = _drive(sides, args.swaps, args.seed, args.profile)
        wall_s = time.perf_counter() - t0
    _print(model_dir, spec, cfg, args, times, wall_s, same)
    for name, text in profiles.items():
        print(f"\ncProfile of the swaps ({name}), sorted by {args.profile}:\n{text}")
    write_json(args.json, {"suite": "swap_host", "model": str(model_dir), "machine": machine_info(),
                           "hidden_size": spec.hidden_size, "layers": spec.num_layers,
                           "capacity": cfg.kv.capacity_tokens, "swaps": args.swaps,
                           "baseline": "the same import_state with every snapshot check at the boundary",
                           "same_state": same,
                           "parts_ms": {name: {p: percentiles(v) for p, v in t.items()} for name, t in times.items()}})
    if not same:
        log.error("the baseline and the current swap left different slots or frames")
        return 1
    return 0


def _print(model_dir, spec, cfg, args, times, wall_s, same) -> None:
    m = machine_info()
    print(f"machine: {m['cpu']} x{m['cpu_count']}, python {m['python']}, numpy {m['numpy']}")
    print(f"model: {model_dir} (hidden {spec.hidden_size}, {spec.num_layers} layers), {cfg.kv.capacity_tokens} KV "
          f"slots, {cfg.vision.tokens_per_frame} tokens per frame, policy {cfg.kv.eviction_policy}; {args.swaps} "
          f"swaps per side in {wall_s:.1f} s; same slots and frames after every swap: {'yes' if same else 'NO'}")
    rows = []
    for part in PARTS:
        b, a = percentiles(times["before"][part]), percentiles(times["after"][part])
        rows.append([part, b["p50"], b["p99"], b["max"], a["p50"], a["p99"], a["max"],
                     b["p50"] / a["p50"] if a["p50"] else float("nan")])
    print_table("swap at the boundary (ms): before = every check at the boundary, after = the loader's pre-checks; "
                "ratio = before p50 / after p50 "
                "(bookkeeping = apply without the KV copy and the late recompute)",
                ["part", "before p50", "p99", "max", "after p50", "p99", "max", "ratio"], rows)


def _ensure_model(model_dir: Path) -> None:
    if (model_dir / "config.json").is_file():
        return
    from ..model.make_model import make_model
    log.info("model %s missing: writing the tiny model there", model_dir)
    make_model("tiny", model_dir)


def add_arguments(p) -> None:
    p.add_argument("--model", help="model directory (default: model.path from the configuration: the tiny model)")
    p.add_argument("--capacity", type=int, default=4096, help="KV slots (the robot's: 4096)")
    p.add_argument("--swaps", type=int, default=300, help="swaps per side")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--profile", nargs="?", const="tottime", default=None,
                   help="cProfile the swaps; sort key (default tottime)")
    p.add_argument("--json", help="write the results here")


def main(argv=None) -> int:
    return module_main("swap_host", __doc__, add_arguments, run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
