"""Two hosts: camera_ingest (and the camera) in one network namespace, reasoning and reconciler (and
a controller) in another, joined only by a veth pair; Fast DDS discovers across it over UDPv4
(no shared-memory shortcut). Skipped where network namespaces cannot be made (not root, no `ip`).

Traffic stays inside the two namespaces this test makes: each has only its loopback and its end
of the veth pair, addressed in 198.18.0.0/15 (the range set aside for network tests).
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import ros_helpers as H
from vla_edge_ros.config import default_config_path

pytestmark = pytest.mark.ros
HERE = Path(__file__).resolve().parent
SECONDS = 10.0


def _ip(*args, check=True):
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=20)


@pytest.fixture
def two_hosts():
    """(ns_a, ns_b, veth in b) joined by a veth pair; removed afterwards."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("network namespaces need root and iproute2")
    tag = f"{os.getpid() % 10000}"
    a, b, va, vb = f"vla_cam_{tag}", f"vla_gpu_{tag}", f"vlaa{tag}", f"vlab{tag}"
    made = _ip("netns", "add", a, check=False)
    if made.returncode != 0:
        pytest.skip(f"cannot make a network namespace here: {made.stderr.strip()}")
    try:
        _ip("netns", "add", b)
        _ip("link", "add", va, "netns", a, "type", "veth", "peer", "name", vb, "netns", b)
        for ns, dev, addr in ((a, va, "198.18.11.1/24"), (b, vb, "198.18.11.2/24")):
            _ip("-n", ns, "addr", "add", addr, "dev", dev)
            _ip("-n", ns, "link", "set", "lo", "up")
            _ip("-n", ns, "link", "set", dev, "up")
            _ip("-n", ns, "route", "add", "224.0.0.0/4", "dev", dev)     # DDS discovery is multicast
        yield a, b, vb
    finally:
        for ns in (a, b):
            _ip("netns", "del", ns, check=False)


def _rx_bytes(ns: str, dev: str) -> int:
    out = subprocess.run(["ip", "netns", "exec", ns, "cat", f"/sys/class/net/{dev}/statistics/rx_bytes"],
                         capture_output=True, text=True, check=True, timeout=10)
    return int(out.stdout)


def test_camera_on_one_host_policy_on_another(two_hosts, tiny_model_dir, tmp_path):
    ns_a, ns_b, veth_b = two_hosts
    env, marker = H.marked_env(H.ros_domain(__name__))
    env.update({"ROS_AUTOMATIC_DISCOVERY_RANGE": "SUBNET", "FASTDDS_BUILTIN_TRANSPORTS": "UDPv4",
                "PYTHONPATH": os.pathsep.join([str(HERE), env.get("PYTHONPATH", "")])})
    # The CPU preset, as the demo uses: the numpy cycle grows with the cached context (cpu_demo.yaml says why).
    cli = [sys.executable, "-m", "vla_edge_ros.cli", "bringup", "--model", str(tiny_model_dir),
           "--params", str(default_config_path().parent / "cpu_demo.yaml"),
           "--set", f"cycle.deadline_ms={H.PLUMBING_DEADLINE_MS}"]
    hosts = {
        ns_b: subprocess.Popen(["ip", "netns", "exec", ns_b] + cli + ["--nodes", "reasoning,reconciler"], env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True),
        ns_a: subprocess.Popen(["ip", "netns", "exec", ns_a] + cli + ["--nodes", "camera_ingest"], env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True),
    }
    outputs = {}
    try:
        for ns, proc in hosts.items():
            deadline = time.monotonic() + H.GRAPH_START_TIMEOUT_S
            line = ""
            while "Ctrl-C stops" not in line:
                line = proc.stdout.readline()
                assert line or proc.poll() is None, f"bringup in {ns} exited"
                assert time.monotonic() < deadline, f"bringup in {ns} did not come up"
        rx_before = _rx_bytes(ns_b, veth_b)
        peer = [sys.executable, str(HERE / "netns_peer.py")]
        controller = subprocess.Popen(["ip", "netns", "exec", ns_b] + peer + ["controller", str(SECONDS + 3),
                                      str(tmp_path / "outputs.json")], env=env)
        time.sleep(1.0)
        camera = subprocess.run(["ip", "netns", "exec", ns_a] + peer + ["camera", str(SECONDS)], env=env,
                                capture_output=True, text=True, timeout=SECONDS + 60)
        assert camera.returncode == 0, camera.stderr[-2000:]
        assert controller.wait(timeout=60) == 0
        rx = _rx_bytes(ns_b, veth_b) - rx_before
        outputs = json.loads((tmp_path / "outputs.json").read_text())
        for proc in hosts.values():
            proc.send_signal(signal.SIGINT)
        logs = {ns: proc.communicate(timeout=60)[0] for ns, proc in hosts.items()}
    finally:
        for proc in hosts.values():
            if proc.poll() is None:
                proc.kill()
        for pid in H.marked_processes(marker):
            os.kill(pid, signal.SIGKILL)
    ids = sorted(outputs["actions"] + [c for c, _ in outputs["fallbacks"]])
    actions = sorted(outputs["actions"])
    assert actions, f"no action crossed the veth; fallbacks {outputs['fallbacks'][:10]}"
    # While frames flow (from the first action, before which discovery across the link means no_frame,
    # to the last, after which the camera has stopped) the policy acts.
    after = [c for c in ids if actions[0] <= c <= actions[-1]]
    print(f"\ntwo hosts over a veth pair ({ns_a} -> {ns_b}, UDPv4 only): {camera.stdout.strip()}; the controller in "
          f"{ns_b} saw {len(ids)} cycles (ids {ids[0]}..{ids[-1]}), the first action at cycle {actions[0]}, "
          f"then {len(actions)} actions in the {len(after)} cycles up to the last one; {rx / 2**20:.1f} MiB received on {veth_b}")
    # No gaps once frames flow (right at the match, DDS may drop the very first samples of a writer).
    H.assert_no_gaps([c for c in ids if c >= actions[0]])
    flowing = {c: ("action",) for c in actions}
    flowing.update({c: ("fallback", reason) for c, reason in outputs["fallbacks"] if actions[0] <= c <= actions[-1]})
    print(H.assert_acts_or_explains_load(flowing, min_actions=5))
    # The frames crossed the veth: at least each action's /vla/frame image (128 x 64 rgb8) came over it.
    assert rx >= len(actions) * 128 * 64 * 3, rx
    for ns, proc in hosts.items():
        assert proc.returncode == 0, (ns, logs[ns][-2000:])
