"""Launch the vla_edge_ros graph on a robot (needs launch and launch_ros, i.e. a ROS install).

    ros2 launch vla_edge_ros vla_edge.launch.py [params_file:=FILE]

One process per node of `vla_edge_ros.nodes.graph.NODES` (the same table
`vla-edge bringup` starts from, so the two cannot drift), all reading the
parameter file. Lifecycle nodes (the reconciler) are configured as soon as
they start and activated when they reach 'inactive'.
"""
import os

from ament_index_python.packages import get_package_share_directory
from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument
from launch.actions import EmitEvent
from launch.actions import RegisterEventHandler
from launch.events import matches_action
from launch.substitutions import LaunchConfiguration
from launch_ros.actions import LifecycleNode
from launch_ros.actions import Node
from launch_ros.event_handlers import OnStateTransition
from launch_ros.events.lifecycle import ChangeState
from lifecycle_msgs.msg import Transition

from vla_edge_ros.nodes.graph import NODES
from vla_edge_ros.nodes.graph import PACKAGE
from vla_edge_ros.nodes.graph import PARAMS_FILE


def _node_action(spec, params):
    common = dict(package=PACKAGE, executable=spec.executable, name=spec.name, output="screen",
                  parameters=[params] + ([dict(spec.parameters)] if spec.parameters else []),
                  remappings=list(spec.remaps))
    if spec.lifecycle:
        return LifecycleNode(namespace="", **common)
    return Node(**common)


def _bring_to_active(action):
    """configure now; activate once the node reports 'inactive'."""
    def change(transition_id):
        return EmitEvent(event=ChangeState(lifecycle_node_matcher=matches_action(action), transition_id=transition_id))
    return [
        RegisterEventHandler(OnStateTransition(target_lifecycle_node=action, goal_state="inactive",
                                               entities=[change(Transition.TRANSITION_ACTIVATE)])),
        change(Transition.TRANSITION_CONFIGURE),
    ]


def generate_launch_description():
    default_params = os.path.join(get_package_share_directory(PACKAGE), "config", PARAMS_FILE)
    params = LaunchConfiguration("params_file")
    entities = [DeclareLaunchArgument("params_file", default_value=default_params,
                                      description="ROS parameter file of all nodes (ros__parameters)")]
    for spec in NODES:
        action = _node_action(spec, params)
        entities.append(action)
        if spec.lifecycle:
            entities.extend(_bring_to_active(action))
    return LaunchDescription(entities)
