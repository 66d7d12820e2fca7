"""Launch the vla_edge_ros graph on a robot (needs launch and launch_ros, i.e. a ROS install).

    ros2 launch vla_edge_ros vla_edge.launch.py [params_file:=FILE]

One process per node of `vla_edge_ros.nodes.graph.NODES` (the same table
`vla-edge bringup` starts from, so the two cannot drift), all reading the
parameter file, with the table's restart policy (as tools/supervisor.py
applies it without launch):
  - the parameter file is checked first (config.load): a bad file or value
    ends the launch with one line naming it, before any node starts;
  - Fast DDS shared-memory files left by processes that died are removed
    before any node starts (tools/dds_shm.py; a process that lives keeps its);
  - the nodes run with the Fast DDS profile of dds.shm_health_check_ms
    (tools/dds_profile.py: a first send to a port waits ~a third of it, not
    333 ms), unless the environment already chooses the transports;
  - a node whose row says `respawn` is restarted after
    supervisor.restart_backoff_s (launch's respawn has a fixed delay, no
    doubling); any other node's exit shuts the launch down;
  - lifecycle nodes are configured each time their process starts (so a
    respawned reconciler comes back too) and activated on reaching 'inactive'.
"""
import os

from ament_index_python.packages import get_package_share_directory
from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument
from launch.actions import EmitEvent
from launch.actions import LogInfo
from launch.actions import OpaqueFunction
from launch.actions import RegisterEventHandler
from launch.actions import SetEnvironmentVariable
from launch.actions import Shutdown
from launch.event_handlers import OnProcessStart
from launch.events import matches_action
from launch.substitutions import LaunchConfiguration
from launch_ros.actions import LifecycleNode
from launch_ros.actions import Node
from launch_ros.event_handlers import OnStateTransition
from launch_ros.events.lifecycle import ChangeState
from lifecycle_msgs.msg import Transition

from vla_edge_ros.config import ConfigError
from vla_edge_ros.config import load
from vla_edge_ros.nodes.graph import NODES
from vla_edge_ros.nodes.graph import PACKAGE
from vla_edge_ros.nodes.graph import PARAMS_FILE
from vla_edge_ros.tools.dds_profile import PROFILE_ENV
from vla_edge_ros.tools.dds_profile import use_profile
from vla_edge_ros.tools.dds_shm import clean_before_start


def _node_action(spec, params: str, cfg):
    common = dict(package=PACKAGE, executable=spec.executable, name=spec.name, output="screen",
                  parameters=[params] + ([dict(spec.parameters)] if spec.parameters else []),
                  remappings=list(spec.remaps))
    if spec.respawn:
        common.update(respawn=True, respawn_delay=cfg.supervisor.restart_backoff_s)
    else:
        common.update(on_exit=[Shutdown(reason=f"node {spec.name} exited")])
    if spec.lifecycle:
        return LifecycleNode(namespace="", **common)
    return Node(**common)


def _bring_to_active(action):
    """configure whenever the process starts; activate once the node reports 'inactive'."""
    def change(transition_id):
        return EmitEvent(event=ChangeState(lifecycle_node_matcher=matches_action(action), transition_id=transition_id))
    return [
        RegisterEventHandler(OnProcessStart(target_action=action, on_start=[change(Transition.TRANSITION_CONFIGURE)])),
        RegisterEventHandler(OnStateTransition(target_lifecycle_node=action, goal_state="inactive",
                                               entities=[change(Transition.TRANSITION_ACTIVATE)])),
    ]


def graph_actions(context):
    """The node processes, once the parameter file is known and valid."""
    params = LaunchConfiguration("params_file").perform(context)
    try:
        cfg = load(params)
    except ConfigError as exc:
        raise RuntimeError(f"vla_edge_ros: {exc}") from None      # launch prints it as one line
    # Fast DDS files that killed or crashed processes left in /dev/shm hold memory until reboot
    # (vla_edge_ros/tools/dds_shm.py): removed before any node starts, live ones kept, and said.
    found = clean_before_start()
    entities = [LogInfo(msg=f"vla_edge_ros: {found.describe()}")] if found.segments or found.ports else []
    # The nodes' Fast DDS profile (vla_edge_ros/tools/dds_profile.py), named in the environment they start with
    # unless the one launch runs in already chooses the transports.
    profile = use_profile(cfg.dds.shm_health_check_ms, dict(os.environ))
    if profile.path and os.environ.get(PROFILE_ENV) != profile.path:
        entities.append(SetEnvironmentVariable(PROFILE_ENV, profile.path))
    entities.append(LogInfo(msg=f"vla_edge_ros: DDS: {profile.describe()}"))
    for spec in NODES:
        action = _node_action(spec, params, cfg)
        entities.append(action)
        if spec.lifecycle:
            entities.extend(_bring_to_active(action))
    return entities


def generate_launch_description():
    default_params = os.path.join(get_package_share_directory(PACKAGE), "config", PARAMS_FILE)
    return LaunchDescription([
        DeclareLaunchArgument("params_file", default_value=default_params,
                              description="ROS parameter file of all nodes (ros__parameters)"),
        OpaqueFunction(function=graph_actions),
    ])
