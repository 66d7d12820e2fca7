"""A fixed mmap threshold gives a freed swap snapshot's memory back to the OS; glibc's dynamic one keeps it.

The loop is what a node does with swap snapshots: load one of 118..125 frames of vision rows
(~24 MiB), drop the previous one. Run in a child process each way, so the threshold (process-wide)
starts from glibc's default both times."""
import subprocess
import sys
import textwrap

import pytest

CHILD = textwrap.dedent("""
    import sys
    import numpy as np
    from vla_edge_ros.core.malloc_threshold import pin_mmap_threshold

    def rss_mib():
        for line in open("/proc/self/status"):
            if line.startswith("VmRSS"):
                return int(line.split()[1]) / 1024

    why_not = pin_mmap_threshold(float(sys.argv[1]))
    assert why_not is None, why_not
    base = rss_mib()
    held = None
    for i in range(40):
        held = np.ones((125 - i % 7) * 32 * 1536, np.float32)      # the next snapshot in, the last one out
    print(rss_mib() - base - held.nbytes / 2**20)
""")


def resident_growth_mib(threshold_mib: float) -> float:
    out = subprocess.run([sys.executable, "-c", CHILD, str(threshold_mib)], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    return float(out.stdout)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt and /proc: Linux")
def test_a_fixed_threshold_returns_freed_snapshots_where_the_dynamic_one_keeps_them():
    dynamic, fixed = resident_growth_mib(0), resident_growth_mib(4)
    assert dynamic > 20, f"glibc's dynamic threshold kept only {dynamic:.1f} MiB: the premise no longer holds"
    assert fixed < 5, f"{fixed:.1f} MiB kept resident with a fixed 4 MiB threshold"

