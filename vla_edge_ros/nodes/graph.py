"""The ROS graph of vla_edge_ros as one table.

`launch/vla_edge.launch.py` (robots with launch_ros) and `vla-edge bringup`
(anywhere rclpy runs) both build their processes from `NODES`, so the two
cannot drift apart: same node names, same executables, same parameter file,
same remaps.

    camera_ingest  /camera/image_raw -> /vla/frame
    reasoning      /vla/frame, /vla/instruction -> /vla/action | /vla/fallback,
                   /vla/action_tokens, /vla/state_chunk, /diagnostics (lifecycle node)
    reconciler     /vla/state_chunk -> /vla/reconciler/swap (lifecycle node)

No rclpy import here: the table is plain data.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, field

PACKAGE = "vla_edge_ros"
LAUNCH_FILE = "vla_edge.launch.py"
PARAMS_FILE = "vla_edge.yaml"          # share/vla_edge_ros/config/ when installed

# Topic and service names (DESIGN.md "Interfaces"); every one can be remapped.
CAMERA_TOPIC = "/camera/image_raw"
FRAME_TOPIC = "/vla/frame"
INSTRUCTION_TOPIC = "/vla/instruction"
ACTION_TOPIC = "/vla/action"
ACTION_TOKENS_TOPIC = "/vla/action_tokens"
FALLBACK_TOPIC = "/vla/fallback"
STATE_CHUNK_TOPIC = "/vla/state_chunk"
DIAGNOSTICS_TOPIC = "/diagnostics"
SWAP_SERVICE = "/vla/reconciler/swap"


@dataclass(frozen=True)
class NodeSpec:
    name: str                      # ROS node name (also the parameter-file key if one is node-specific)
    module: str                    # `python -m <module>` runs it
    executable: str                # console script installed by setup.py (launch_ros `executable=`)
    lifecycle: bool = False        # managed node: brought to active after start
    respawn: bool = False          # supervisor policy: restarted (with backoff, back to active) when it dies;
                                   # False: its death ends the run with an error
    remaps: tuple = field(default_factory=tuple)       # ((from, to), ...)
    parameters: tuple = field(default_factory=tuple)   # ((dotted key, value), ...) on top of the params file

    def ros_arguments(self, params_files: list, extra_remaps: tuple = ()) -> list:
        """`--ros-args ...` for this node: node name, params files in order, remaps."""
        args = ["--ros-args", "-r", f"__node:={self.name}"]
        for path in params_files:
            args += ["--params-file", str(path)]
        for key, value in self.parameters:
            args += ["-p", f"{key}:={value}"]
        for src, dst in tuple(self.remaps) + tuple(extra_remaps):
            args += ["-r", f"{src}:={dst}"]
        return args

    def command(self, params_files: list, python: str | None = None, extra_remaps: tuple = ()) -> list:
        """The argv that starts this node as its own process."""
        return [python or sys.executable, "-m", self.module] + self.ros_arguments(params_files, extra_remaps)


# Restart policy (tools/supervisor.py, and launch's respawn):
#   camera_ingest  respawn: it holds no state, and the reasoning node already continues its frame ids
#                  across a camera restart (core/frame_ids.py); meanwhile the cycles answer
#                  stale_frame / no_frame fallbacks, which is what a controller must see.
#   reasoning      no respawn: it is the policy. A restart would lose its cached state and restart
#                  cycle ids at 1 under the controller; its death ends the run, non-zero, at once.
#   reconciler     respawn: nothing waits on it; the reasoning node serves with its own eviction.
NODES: tuple = (
    NodeSpec(name="camera_ingest", module="vla_edge_ros.nodes.camera_ingest", executable="camera_ingest",
             respawn=True),
    NodeSpec(name="reasoning", module="vla_edge_ros.nodes.reasoning", executable="reasoning", lifecycle=True),
    NodeSpec(name="reconciler", module="vla_edge_ros.nodes.reconciler", executable="reconciler", lifecycle=True,
             respawn=True),
)


def node(name: str) -> NodeSpec:
    for spec in NODES:
        if spec.name == name:
            return spec
    raise KeyError(f"no node {name!r} in the graph; nodes: {[s.name for s in NODES]}")


def lifecycle_service(spec: NodeSpec, service: str) -> str:
    """Standard lifecycle service of a managed node, e.g. '/reconciler/change_state'."""
    if not spec.lifecycle:
        raise ValueError(f"node {spec.name!r} is not a lifecycle node")
    return f"/{spec.name}/{service}"
