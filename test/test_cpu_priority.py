"""The reconciler's lower CPU priority reaches every thread of its process, and its session where autogroups are on
(without which the nice value would not count against the reasoning node's process)."""
import subprocess
import sys
import textwrap

CHILD = textwrap.dedent("""
    import os, threading, time
    from pathlib import Path
    from vla_edge_ros.core.cpu_priority import autogroup_nice, lower_process_priority
    stop = threading.Event()
    early = threading.Thread(target=stop.wait)            # started before: must be reniced too
    early.start()
    lower_process_priority(10)
    late_nice = []
    late = threading.Thread(target=lambda: late_nice.append(os.getpriority(os.PRIO_PROCESS, 0)))
    late.start(); late.join()
    nices = []
    for task in Path("/proc/self/task").iterdir():
        try:
            nices.append(os.getpriority(os.PRIO_PROCESS, int(task.name)))
        except ProcessLookupError:                        # `late` may still be listed while it exits
            pass
    stop.set(); early.join()
    group = autogroup_nice()                              # None: autogroups off, or a container's file unreadable
    autogroup = "off" if group is None else group
    print(len(nices), sorted(set(nices)), late_nice[0], autogroup)
""")


def test_every_thread_and_the_session_are_lowered_and_new_threads_inherit():
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    threads, nices, late, autogroup = out.stdout.split(" ", 3)
    assert int(threads) >= 2 and nices.strip() == "[10]", out.stdout
    assert int(late) == 10
    assert autogroup.strip() in ("10", "off"), out.stdout


def test_a_priority_is_never_raised():
    import pytest
    from vla_edge_ros.core.cpu_priority import lower_process_priority
    with pytest.raises(ValueError, match="0..19"):
        lower_process_priority(-5)
