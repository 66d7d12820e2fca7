"""tools/dds_shm.py: Fast DDS shared-memory files of dead processes removed before a graph starts, live ones kept.

The rules are the lock files' flock(2) and, for ports, the live processes' mappings, so the first tests hold real
locks and real mappings from real processes over files laid out as Fast DDS lays them out; the last ones kill a
real rclpy participant with SIGKILL and remove what it left, and check the bringup and launch file call it.
"""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import ros_helpers as H
from vla_edge_ros.tools.dds_shm import DeadShmFiles, SHM_DIR, remove_dead_shm_files

SEGMENT = "fastrtps_0123456789abcdef"
OTHER_SEGMENT = "fastrtps_fedcba9876543210"
HOLD = ("import fcntl, sys, time\n"
        "files = [open(p, 'rb') for p in sys.argv[1:]]\n"
        "for f in files: fcntl.flock(f, fcntl.LOCK_EX if f.name.endswith('_el') else fcntl.LOCK_SH)\n"
        "print('held', flush=True)\n"
        "time.sleep(60)\n")
MAP = ("import mmap, sys, time\n"
       "f = open(sys.argv[1], 'r+b')\n"
       "m = mmap.mmap(f.fileno(), 0)\n"
       "f.close()\n"                                       # mapped, no longer open: only /proc/<pid>/maps shows it
       "print('held', flush=True)\n"
       "time.sleep(60)\n")


def _touch(d: Path, *names):
    for name in names:
        (d / name).write_bytes(b"")


@pytest.fixture
def holder():
    """Start a process that holds flocks on the given files until it is killed."""
    procs = []

    def hold(*paths):
        proc = subprocess.Popen([sys.executable, "-c", HOLD, *map(str, paths)], stdout=subprocess.PIPE, text=True)
        procs.append(proc)
        assert proc.stdout.readline().strip() == "held"
        return proc

    yield hold
    for proc in procs:
        proc.kill()
        proc.wait()


def test_a_dead_segment_goes_and_a_live_one_stays(tmp_path, holder):
    _touch(tmp_path, SEGMENT, SEGMENT + "_el", OTHER_SEGMENT, OTHER_SEGMENT + "_el", "unrelated_file")
    holder(tmp_path / (OTHER_SEGMENT + "_el"))
    assert remove_dead_shm_files(tmp_path) == DeadShmFiles(segments=1, ports=0, in_use=1)
    assert sorted(os.listdir(tmp_path)) == sorted([OTHER_SEGMENT, OTHER_SEGMENT + "_el", "unrelated_file"])


def test_a_segment_without_its_lock_file_goes_only_when_nobody_maps_it(tmp_path):
    (tmp_path / SEGMENT).write_bytes(bytes(4096))
    proc = subprocess.Popen([sys.executable, "-c", MAP, str(tmp_path / SEGMENT)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "held"
        assert remove_dead_shm_files(tmp_path) == DeadShmFiles(segments=0, ports=0, in_use=1)
    finally:
        proc.kill()
        proc.wait()
    assert remove_dead_shm_files(tmp_path) == DeadShmFiles(segments=1, ports=0, in_use=0)


def test_a_port_goes_with_its_semaphore_only_when_none_of_its_locks_is_held(tmp_path, holder):
    dead, shared = "fastrtps_port7411", "fastrtps_port7413"
    _touch(tmp_path, dead, dead + "_el", f"sem.{dead}_mutex", shared, shared + "_el", shared + "_sl",
           f"sem.{shared}_mutex")
    holder(tmp_path / (shared + "_sl"))              # a reader holds the shared lock; the exclusive one is free
    assert remove_dead_shm_files(tmp_path) == DeadShmFiles(segments=0, ports=1, in_use=1)
    assert sorted(os.listdir(tmp_path)) == sorted([shared, shared + "_el", shared + "_sl", f"sem.{shared}_mutex"])


def test_a_port_without_lock_files_goes_unless_a_live_process_maps_it(tmp_path):
    # A writer killed mid-send leaves a port with no lock file at all, and its semaphore possibly still taken.
    mapped, dead = "fastrtps_port7415", "fastrtps_port7417"
    for name in (mapped, dead):
        (tmp_path / name).write_bytes(bytes(4096))
        (tmp_path / f"sem.{name}_mutex").write_bytes(bytes(32))
    proc = subprocess.Popen([sys.executable, "-c", MAP, str(tmp_path / mapped)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "held"
        assert remove_dead_shm_files(tmp_path) == DeadShmFiles(segments=0, ports=1, in_use=1)
        assert sorted(os.listdir(tmp_path)) == sorted([mapped, f"sem.{mapped}_mutex"])
    finally:
        proc.kill()
        proc.wait()
    assert remove_dead_shm_files(tmp_path) == DeadShmFiles(segments=0, ports=1, in_use=0)
    assert os.listdir(tmp_path) == []


def test_a_lock_released_by_a_killed_process_counts_as_dead(tmp_path, holder):
    _touch(tmp_path, SEGMENT, SEGMENT + "_el")
    proc = holder(tmp_path / (SEGMENT + "_el"))
    assert remove_dead_shm_files(tmp_path) == DeadShmFiles(0, 0, 1)
    proc.send_signal(signal.SIGKILL)
    proc.wait()                                       # the kernel drops a dead process's flocks
    assert remove_dead_shm_files(tmp_path) == DeadShmFiles(1, 0, 0)
    assert os.listdir(tmp_path) == []


def test_no_directory_means_nothing_to_remove(tmp_path):
    assert remove_dead_shm_files(tmp_path / "absent") == DeadShmFiles(0, 0, 0)


PARTICIPANT = ("import time, rclpy\n"
               "from sensor_msgs.msg import JointState\n"
               "rclpy.init()\n"
               "node = rclpy.create_node('dds_shm_probe_' + str(__import__('os').getpid()))\n"
               "pub = node.create_publisher(JointState, 'dds_shm_probe', 10)\n"
               "print('up', flush=True)\n"
               "time.sleep(60)\n")


def _participant(env):
    proc = subprocess.Popen([sys.executable, "-c", PARTICIPANT], stdout=subprocess.PIPE, text=True, env=env)
    assert proc.stdout.readline().strip() == "up"
    return proc


def _fastdds_files():
    return {name for name in os.listdir(SHM_DIR) if name.startswith(("fastrtps_", "sem.fastrtps_"))}


@pytest.mark.ros
@pytest.mark.skipif(not SHM_DIR.is_dir(), reason="no /dev/shm on this machine")
def test_a_killed_participants_files_are_removed_and_a_live_ones_kept():
    pytest.importorskip("rclpy")
    # A domain of this test's own: a participant of another test or tool on the machine that discovered the killed
    # one would map its ports, and a port a live process maps stays.
    env = {**os.environ, "ROS_AUTOMATIC_DISCOVERY_RANGE": "LOCALHOST", "ROS_DOMAIN_ID": str(H.ros_domain(__name__))}
    before = _fastdds_files()
    killed = _participant(env)
    after_first = _fastdds_files()
    live = _participant(env)
    try:
        killed_files = after_first - before
        live_files = _fastdds_files() - after_first
        assert killed_files and live_files, "Fast DDS made no shared-memory files for a participant"
        killed.send_signal(signal.SIGKILL)
        killed.wait()
        assert killed_files <= _fastdds_files()        # SIGKILL leaves them behind
        found = remove_dead_shm_files()
        assert found.segments >= 1
        left = _fastdds_files()
        assert not killed_files & left, f"left behind: {sorted(killed_files & left)}"
        assert live_files <= left, f"removed a live participant's {sorted(live_files - left)}"
    finally:
        for proc in (killed, live):
            proc.kill()
            proc.wait()
    time.sleep(0.1)


@pytest.mark.skipif(not SHM_DIR.is_dir(), reason="no /dev/shm on this machine")
def test_the_bringup_removes_dead_files_before_it_starts_a_node():
    from vla_edge_ros.tools.bringup import GraphProcesses
    dead = SHM_DIR / "fastrtps_vlaedgebringup01"
    lock = SHM_DIR / (dead.name + "_el")
    _touch(SHM_DIR, dead.name, lock.name)
    procs = GraphProcesses(nodes=(), env={})
    try:
        procs.start()
        assert not dead.exists() and not lock.exists()
    finally:
        procs.stop()
        dead.unlink(missing_ok=True)
        lock.unlink(missing_ok=True)
