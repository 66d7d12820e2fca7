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


@pytest.mark.parametrize("side_by_side", [False, True])
def test_bringup_activates_the_reconciler_and_stops_on_ctrl_c(tiny_model_dir, side_by_side):
    """One node after the other (the default), and with lifecycle.parallel_configure: both lifecycle nodes
    configured at once, then activated in order."""
    model = tiny_model_dir
    domain = H.ros_domain(__name__)
    harness = H.RosHarness(domain)
    argv = [sys.executable, "-m", "vla_edge_ros.cli", "bringup", "--model", str(model), "--set", "cycle.deadline_ms=50.0",
            "--set", f"lifecycle.parallel_configure={'true' if side_by_side else 'false'}"]
    proc = subprocess.Popen(argv, env=H.graph_env(domain), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        line, start_lines = "", []
        deadline = time.monotonic() + H.GRAPH_START_TIMEOUT_S
        while "Ctrl-C stops" not in line:
            line = proc.stdout.readline()
            start_lines.append(line)
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
    started = "".join(start_lines)
    assert started.count("configured side by side") == (2 if side_by_side else 0), started


def test_a_transition_busy_longer_than_an_answer_wait_is_requested_once(monkeypatch):
    """A configure that holds its node's executor (a cold GPU start: ~30 s) answers neither change_state nor
    get_state meanwhile; bringup waits for it rather than send the transition again, which the node would
    then refuse from its goal state with an RCLError in its log."""
    import threading

    import rclpy
    from lifecycle_msgs.msg import Transition
    from rclpy.executors import SingleThreadedExecutor
    from rclpy.lifecycle import LifecycleNode, TransitionCallbackReturn

    from vla_edge_ros.tools import bringup

    class SlowConfigure(LifecycleNode):
        def __init__(self, context):
            super().__init__("slow_configure", context=context)
            self.configures = 0

        def on_configure(self, state):
            self.configures += 1
            time.sleep(2.0)                    # five times the answer wait below
            return TransitionCallbackReturn.SUCCESS

    monkeypatch.setattr(bringup, "ANSWER_WAIT_S", 0.4)
    harness = H.RosHarness(H.ros_domain(__name__) % 50 + 50)
    slow = SlowConfigure(harness.context)
    executor = SingleThreadedExecutor(context=harness.context)
    executor.add_node(slow)
    errors, stop = [], threading.Event()

    def spin():
        while not stop.is_set():
            try:
                executor.spin_once(timeout_sec=0.1)
            except Exception as exc:  # noqa: BLE001 - what a second request would raise: counted, asserted below
                errors.append(exc)

    thread = threading.Thread(target=spin, daemon=True)
    thread.start()
    client = rclpy.create_node("bringup_side", context=harness.context)    # spun by change_state alone
    try:
        bringup.change_state(client, "/slow_configure/change_state", Transition.TRANSITION_CONFIGURE, 20.0)
        time.sleep(1.0)                        # a second request, had one been sent, would be served by now
        state_id = slow._state_machine.current_state[0]
    finally:
        stop.set()
        thread.join(timeout=5)
        executor.shutdown()
        client.destroy_node()
        slow.destroy_node()
        harness.close()
    assert state_id == State.PRIMARY_STATE_INACTIVE
    assert slow.configures == 1 and not errors, (slow.configures, errors)
