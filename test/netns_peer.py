"""A test peer run inside a network namespace by test_netns_two_hosts.py (`ip netns exec NS python
netns_peer.py ROLE SECONDS [OUT]`): the camera (real footage at 60 Hz on /camera/image_raw), or a
controller that records every cycle output it receives and writes them as JSON to OUT."""
import json
import sys
import time

from diagnostic_msgs.msg import DiagnosticStatus

import ros_helpers as H
from vla_edge_ros.nodes import conversions as conv
from vla_edge_ros.nodes import graph
from vla_edge_ros.nodes.interfaces import ActionTokens


def main(role: str, seconds: float, out: str = "") -> int:
    harness = H.RosHarness(int(__import__("os").environ["ROS_DOMAIN_ID"]), name=f"netns_{role}")
    try:
        if role == "camera":
            camera = H.CameraPublisher(harness, H.footage_rgb(120)).start()
            time.sleep(seconds)
            camera.stop()
            print(f"camera: published {len(camera.sent)} frames", flush=True)
            return 0
        tokens = harness.collect(ActionTokens, graph.ACTION_TOKENS_TOPIC)
        fallbacks = harness.collect(DiagnosticStatus, graph.FALLBACK_TOPIC)
        time.sleep(seconds)
        outputs = {"actions": [conv.action_tokens_fields(m)["cycle_id"] for m in tokens.messages()],
                   "fallbacks": [[int(conv.status_values(m)["cycle_id"]), m.message] for m in fallbacks.messages()]}
        with open(out, "w") as f:
            json.dump(outputs, f)
        return 0
    finally:
        harness.close()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], float(sys.argv[2]), *sys.argv[3:]))
