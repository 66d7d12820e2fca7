"""The generated types of vla_edge_interfaces, imported in one place.

vla_edge_interfaces (msg/srv of the graph's internal channels) is an ament_cmake
package of this repository, generated and compiled by colcon, not a Python
package pip installs: where it has not been built, the import below says how
to build it rather than leaving a bare ModuleNotFoundError.
"""
from __future__ import annotations

try:
    from vla_edge_interfaces.msg import ActionTokens
    from vla_edge_interfaces.msg import Frame as FrameMsg
    from vla_edge_interfaces.msg import KvIpcHandle
    from vla_edge_interfaces.msg import StateChunk
    from vla_edge_interfaces.srv import Swap
except ImportError as exc:          # not built in this environment
    raise ImportError(
        f"vla_edge_interfaces is not importable ({exc}): build it with scripts/build_interfaces.sh (make demo and "
        f"make test run it through scripts/bootstrap.sh); in a ROS workspace, colcon build --base-paths "
        f"src/vla_edge_ros/vla_edge_interfaces src/vla_edge_ros") from exc

__all__ = ["ActionTokens", "FrameMsg", "KvIpcHandle", "StateChunk", "Swap"]
