"""`vla-edge bringup` as a user runs it: three node processes, the reconciler brought to active
through the standard lifecycle services, all of them stopped cleanly by one Ctrl-C."""
import signal
import subprocess
import sys
import time

import pytest
from lifecycle_msgs.msg import State
from lifecycle_msgs.srv import GetState
from rcl_interfaces.srv import GetParameters

import ros_helpers as H
from vla_edge_ros.nodes import graph

pytestmark = pytest.mark.ros


def test_bringup_activates_the_reconciler_and_stops_on_ctrl_c(tiny_model_dir):
    model = tiny_model_dir
    domain = H.ros_domain(__name__)
    harness = H.RosHarness(domain)
    argv = [sys.executable, "-m", "vla_edge_ros.cli", "bringup", "--model", str(model), "--set", "cycle.deadline_ms=50.0"]
    proc = subprocess.Popen(argv, env=H.graph_env(domain), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        line = ""
        deadline = time.monotonic() + H.GRAPH_START_TIMEOUT_S
        while "Ctrl-C stops" not in line:
            line = proc.stdout.readline()
            assert line or proc.poll() is None, "bringup exited before the graph was up"
            assert time.monotonic() < deadline, "bringup did not report the graph up"
        state = H.call_service(harness, GetState, f"/{graph.node('reconciler').name}/get_state", GetState.Request())
        assert state.current_state.id == State.PRIMARY_STATE_ACTIVE
        wanted = {spec.name for spec in graph.NODES}
        H.wait_until(lambda: wanted <= {n for n, _ in harness.node.get_node_names_and_namespaces()}, 10.0,
                     f"nodes {sorted(wanted)} in the ROS graph")
        # --set reached the nodes: the reasoning node's cycle uses the overridden deadline.
        value = H.call_service(harness, GetParameters, "/reasoning/get_parameters",
                               GetParameters.Request(names=["cycle.deadline_ms"])).values[0].double_value
        assert value == 50.0
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
        harness.close()
    assert proc.returncode == 0, out
    assert "stopped, exit codes {'camera_ingest': 0, 'reasoning': 0, 'reconciler': 0}" in out, out
