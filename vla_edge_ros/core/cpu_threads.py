"""How many CPU threads the numpy backend's BLAS (and torch, for baselines) may use.

The matrices of one control cycle are small (a few rows by a few hundred
columns on the CPU model). Splitting them across threads costs more in wake-up
and synchronisation than it saves, and on a small robot computer the three
node processes compete for the same cores: measured on the 2-core development
machine, multi-threaded OpenBLAS made cycle latency 5-10x worse and far
noisier than one thread. The count comes from `model.cpu_threads`.
"""
from __future__ import annotations

import logging

log = logging.getLogger(__name__)


def limit_cpu_threads(n: int) -> None:
    """Process-wide: BLAS pools loaded so far and torch (when it is imported) use `n` threads."""
    from threadpoolctl import threadpool_limits
    threadpool_limits(limits=n)
    import sys
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(n)
    log.debug("CPU threads limited to %d", n)
