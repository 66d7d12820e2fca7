"""tools/dds_profile.py: the graph's processes run with Fast DDS's shared-memory ports checked for
dds.shm_health_check_ms.

The profile's text is checked as XML, the choices the environment already made are kept, and then Fast DDS itself is
asked: real rclpy participants started with the profile talk to each other over it, Fast DDS reports no error
reading it, and the shared-memory ports they make carry the configured check time (and a third of it, the wait) in
their header, where a participant without the profile writes Fast DDS's 1000 and 333.
"""
import os
import signal
import struct
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

import ros_helpers as H
from vla_edge_ros import config as C
from vla_edge_ros.tools import dds_profile as P
from vla_edge_ros.tools.bringup import GraphProcesses

ROOT = Path(__file__).resolve().parents[1]
NS = {"f": "http://www.eprosima.com/XMLSchemas/fastRTPS_Profiles"}
CLEAN = {k: v for k, v in os.environ.items() if k not in P.USER_CHOICE_ENVS and k != "RMW_IMPLEMENTATION"}


def test_the_profile_keeps_both_built_in_transports_and_sets_the_check():
    root = ET.fromstring(P.profile_xml(150))
    descriptors = {d.find("f:transport_id", NS).text: d for d in root.iterfind("f:transport_descriptors/"
                                                                              "f:transport_descriptor", NS)}
    assert [d.find("f:type", NS).text for d in descriptors.values()] == ["SHM", "UDPv4"]
    (shm,) = [d for d in descriptors.values() if d.find("f:type", NS).text == "SHM"]
    assert shm.find("f:healthy_check_timeout_ms", NS).text == "150"
    participant = root.find("f:participant", NS)
    assert participant.get("is_default_profile") == "true"
    used = [t.text for t in participant.iterfind("f:rtps/f:userTransports/f:transport_id", NS)]
    assert used == list(descriptors)                           # shared memory first, as Fast DDS's built-ins
    assert participant.find("f:rtps/f:useBuiltinTransports", NS).text == "false"


def test_use_profile_names_its_file_and_keeps_what_the_environment_chose(tmp_path):
    env = dict(CLEAN)
    chosen = P.use_profile(150, env, directory=tmp_path)
    assert env[P.PROFILE_ENV] == chosen.path == str(tmp_path / "shm_check_150ms.xml")
    assert "checked for 150 ms" in chosen.describe()
    first = Path(chosen.path).stat().st_mtime_ns
    assert P.use_profile(150, env, directory=tmp_path).path == chosen.path        # an earlier graph's: reused
    assert Path(chosen.path).stat().st_mtime_ns == first                           # not rewritten
    assert P.use_profile(60, env, directory=tmp_path).path == str(tmp_path / "shm_check_60ms.xml")
    assert env[P.PROFILE_ENV].endswith("shm_check_60ms.xml")                       # ours, so replaced
    for var, value in ((P.PROFILE_ENV, "/etc/robot/fastdds.xml"), ("FASTDDS_DEFAULT_PROFILES_FILE", "/x.xml"),
                       ("FASTDDS_BUILTIN_TRANSPORTS", "UDPv4")):
        env = {**CLEAN, var: value}
        kept = P.use_profile(150, env, directory=tmp_path)
        assert env == {**CLEAN, var: value} and "kept" in kept.describe() and value in kept.describe()
    env = {**CLEAN, "RMW_IMPLEMENTATION": "rmw_cyclonedds_cpp"}
    assert P.use_profile(150, env, directory=tmp_path).path is None and P.PROFILE_ENV not in env
    env = {**CLEAN, "RMW_IMPLEMENTATION": "rmw_fastrtps_cpp"}
    assert P.use_profile(150, env, directory=tmp_path).path is not None
    env = dict(CLEAN)
    assert P.use_profile(0, env, directory=tmp_path).path is None and env == CLEAN


def test_the_config_key_is_checked():
    assert C.load().dds.shm_health_check_ms == 150
    for bad in (10, -1, 20000, 1.5, True):
        with pytest.raises(C.ConfigError, match="dds.shm_health_check_ms"):
            C.load().replace({"dds.shm_health_check_ms": bad})
    assert C.load().replace({"dds.shm_health_check_ms": 0}).dds.shm_health_check_ms == 0


def test_graph_processes_give_the_nodes_the_profile(monkeypatch):
    procs = GraphProcesses(params_file=ROOT / "config" / "vla_edge.yaml", env=dict(CLEAN))
    assert procs.env[P.PROFILE_ENV] == procs.dds_profile.path
    assert procs.env[P.PROFILE_ENV].endswith("shm_check_150ms.xml")
    procs.stop()
    procs = GraphProcesses(params_file=ROOT / "config" / "vla_edge.yaml", env=dict(CLEAN),
                           overrides={"dds.shm_health_check_ms": 0})
    assert P.PROFILE_ENV not in procs.env
    procs.stop()
    # Without an environment of its own, the graph's is this process's: named here too, for the demo's participants.
    # (setenv first, so that the test's end takes the name out of this process's environment again)
    for var in P.USER_CHOICE_ENVS:
        monkeypatch.setenv(var, "")
        monkeypatch.delenv(var)
    procs = GraphProcesses(params_file=ROOT / "config" / "vla_edge.yaml")
    assert os.environ[P.PROFILE_ENV] == procs.env[P.PROFILE_ENV] == procs.dds_profile.path
    procs.stop()


# A participant that subscribes, answers "ready" and, once a message came, prints the Fast DDS shared-memory ports it
# maps (its own listening ports: it made them).
LISTENER = """
import re, sys, time
import rclpy
from std_msgs.msg import String
rclpy.init()
node = rclpy.create_node("dds_profile_listener")
got = []
node.create_subscription(String, "/dds_profile_check", lambda m: got.append(m.data), 10)
print("ready", flush=True)
end = time.monotonic() + 20.0
while not got and time.monotonic() < end:
    rclpy.spin_once(node, timeout_sec=0.1)
ports = sorted({m.group(1) for m in re.finditer(r"(/dev/shm/fastrtps_port\\d+)$", open("/proc/self/maps").read(), re.M)})
print("got", got[:1], flush=True)
print("ports", " ".join(ports), flush=True)
print("headers", " ".join(open(p, "rb").read(4096).hex() for p in ports), flush=True)
"""
TALKER = """
import time
import rclpy
from std_msgs.msg import String
rclpy.init()
node = rclpy.create_node("dds_profile_talker")
pub = node.create_publisher(String, "/dds_profile_check", 10)
end = time.monotonic() + 20.0
while time.monotonic() < end:
    pub.publish(String(data="over shared memory"))
    rclpy.spin_once(node, timeout_sec=0.1)
"""


def _talk(env: dict) -> tuple:
    """A talker and a listener process in `env`, a domain of this test's own: (what the listener got, its ports'
    headers, both stderrs). Ports that dead processes left are removed first (tools/dds_shm.py): Fast DDS reuses a
    port file of the same number whose check passes, and its header is then its first maker's."""
    from vla_edge_ros.tools.dds_shm import clean_before_start
    clean_before_start()
    env = {**env, "ROS_AUTOMATIC_DISCOVERY_RANGE": "LOCALHOST", "ROS_DOMAIN_ID": str(H.ros_domain(__name__))}
    listener = subprocess.Popen([sys.executable, "-c", LISTENER], env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
    talker = None
    try:
        assert listener.stdout.readline().strip() == "ready"
        talker = subprocess.Popen([sys.executable, "-c", TALKER], env=env, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.PIPE, text=True)
        out, err = listener.communicate(timeout=60)
    finally:
        for proc in (listener, talker):                     # SIGINT: rclpy shuts down and Fast DDS frees its ports
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGINT)
        for proc in (listener, talker):
            if proc is not None:
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
    lines = dict(line.split(" ", 1) for line in out.splitlines() if " " in line)
    headers = [bytes.fromhex(h) for h in lines.get("headers", "").split()]
    return lines.get("got", ""), headers, err + (talker.stderr.read() if talker else "")


@pytest.mark.ros
@pytest.mark.skipif(not Path("/dev/shm").is_dir(), reason="no /dev/shm: Fast DDS has no shared-memory transport here")
def test_fast_dds_takes_the_profile_and_its_ports_carry_the_check(tmp_path):
    env = dict(CLEAN)
    P.use_profile(90, env, directory=tmp_path)
    got, headers, err = _talk(env)
    assert "over shared memory" in got, err
    assert headers, "the listener mapped no Fast DDS shared-memory port"
    assert all(struct.pack("<II", 90, 30) in h for h in headers), "a port without the profile's check and wait"
    assert "XMLPARSER" not in err and "Error" not in err, err
    # Without it, the same participants write Fast DDS's own values: the test can tell the two apart.
    got, headers, err = _talk(dict(CLEAN))
    assert "over shared memory" in got, err
    assert headers and all(struct.pack("<II", 1000, 333) in h for h in headers)


def test_the_command_prints_the_line_that_names_the_profile(tmp_path):
    """`vla-edge dds-profile`: for a process the graph does not start (a controller, rviz, `ros2 run`)."""
    def command(*args):
        return subprocess.run([sys.executable, "-m", "vla_edge_ros.cli", "dds-profile", *args], env=dict(CLEAN),
                              capture_output=True, text=True, timeout=60)
    done = command("--set", "dds.shm_health_check_ms=120")
    assert done.returncode == 0, done.stderr
    (line,) = done.stdout.splitlines()
    name, _, path = line.removeprefix("export ").partition("=")
    assert name == P.PROFILE_ENV and "<healthy_check_timeout_ms>120<" in Path(path).read_text()
    assert "checked for 120 ms" in done.stderr
    done = command("--set", "dds.shm_health_check_ms=0")
    assert done.returncode == 0 and done.stdout == "" and "own transport settings" in done.stderr
    done = command("--set", "dds.shm_health_check_ms=5")
    assert done.returncode == 2 and "dds.shm_health_check_ms must be 0" in done.stderr
