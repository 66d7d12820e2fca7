"""A profile of the swaps at the cycle boundary: where their time goes (a diagnostic, off unless asked for).

With `VLA_EDGE_PROFILE_SWAPS=<file>` in the reasoning node's environment, every
SwapClient.apply_ready call is run under cProfile (the profiler is enabled
around each call only, off between them) and the statistics, sorted by own
time and by cumulative time, are written to <file> when the cycle thread
stops. cProfile slows the Python it measures by about 2x, so the swap timings
of such a run are not the product's; the profile says how the time divides
between functions. Why it exists: on the H200 the swap's parts at the boundary
(checks, slots, queuing the KV copy, the rest) were each 0.2-0.4 ms p50, three
to four times what the host benchmark (bench/swap_host.py, numpy backend)
measures for the same Python, and the difference is in the GPU path's calls.
"""
from __future__ import annotations

import cProfile
import io
import os
import pstats
import threading
from pathlib import Path

ENV = "VLA_EDGE_PROFILE_SWAPS"
TOP = 40            # rows per sort order in the written statistics


class SwapProfile:
    """Runs calls under one cProfile.Profile and writes its statistics once, to `path`."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.calls = 0
        self._profile = cProfile.Profile()
        self._lock = threading.Lock()       # enable/disable and the write never overlap

    @classmethod
    def from_env(cls) -> "SwapProfile | None":
        path = os.environ.get(ENV, "")
        return cls(path) if path else None

    def call(self, fn, *args, **kwargs):
        with self._lock:
            self.calls += 1
            self._profile.enable()
            try:
                return fn(*args, **kwargs)
            finally:
                self._profile.disable()

    def write(self) -> Path | None:
        """The statistics to `path` (its folder made): own time first, then cumulative; None when no call ran."""
        with self._lock:
            if not self.calls:
                return None
            out = io.StringIO()
            out.write(f"{ENV}: {self.calls} calls of SwapClient.apply_ready under cProfile\n")
            for key in ("tottime", "cumulative"):
                out.write(f"\n--- sorted by {key} ---\n")
                pstats.Stats(self._profile, stream=out).sort_stats(key).print_stats(TOP)
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.path.write_text(out.getvalue())
            return self.path
