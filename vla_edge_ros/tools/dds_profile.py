"""The Fast DDS profile the graph's processes run with: shared-memory ports checked for dds.shm_health_check_ms.

Fast DDS's shared-memory transport opens another process's port the first time it sends there, inside the send
call and with the participant's sends held (find_port in SharedMemTransport::send). Opening an existing port
checks its listeners first: a listener waiting for data counts as alive once it has woken since the last time a
watchdog looked at it, and it wakes every third of the port's check time. A check that falls between the watchdog's
look and that wake-up sleeps the third and looks again. The port's maker stores both times in the port, and Fast
DDS's default is 1000 ms, so such a first send waits ~333 ms. In `vla-edge demo` on the 2-core machine that held the
camera's publish 320-336 ms, ~2.6 s after the camera started, in 3 of 10 8-second demos (each then gave 3
stale_frame fallbacks); with ports checked for 150 ms, 0 of 10 (the slowest publish 7.2 ms; notes/cpu_notes.md).

What this module does: writes a profile that keeps Fast DDS's two built-in transports (shared memory, then UDPv4)
with the shared-memory port check set to dds.shm_health_check_ms, and names it in FASTRTPS_DEFAULT_PROFILES_FILE
(the variable Fast DDS 2.x, ROS 2 Jazzy's, reads when a process makes its first participant) for the graph's
processes. It leaves the environment alone where the user chose already: a profile named in that variable (or in
FASTDDS_DEFAULT_PROFILES_FILE, Fast DDS 3.x's), built-in transports chosen with FASTDDS_BUILTIN_TRANSPORTS, an RMW
other than Fast DDS, or dds.shm_health_check_ms 0. The bound covers ports this graph's processes make (a camera
driver sending to camera_ingest, the nodes to one another); a foreign subscriber's port keeps its own maker's.
`vla-edge dds-profile` prints the line that gives any other process the same profile (a controller, rviz, a node
started with `ros2 run`): `eval "$(vla-edge dds-profile)"` in its shell first.
"""
from __future__ import annotations

import os
import shlex
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from xml.sax.saxutils import escape

PROFILE_ENV = "FASTRTPS_DEFAULT_PROFILES_FILE"          # Fast DDS 2.x (ROS 2 Jazzy: 2.14)
USER_CHOICE_ENVS = (PROFILE_ENV, "FASTDDS_DEFAULT_PROFILES_FILE", "FASTDDS_BUILTIN_TRANSPORTS")
FASTDDS_RMWS = ("rmw_fastrtps_cpp", "rmw_fastrtps_dynamic_cpp")
PROFILE_NAME = "vla_edge_participant"


@dataclass(frozen=True)
class DdsProfile:
    """What the graph's processes run with: `path` (None: nothing of ours) and why, as one line."""
    path: str | None
    reason: str

    def describe(self) -> str:
        return self.reason


def profile_xml(health_check_ms: int) -> str:
    """A Fast DDS 2.x profile: the default participant with the built-in transports' pair (shared memory first, then
    UDPv4), the shared-memory one's port check health_check_ms; every other value Fast DDS's default."""
    ms = int(health_check_ms)
    return f"""<?xml version="1.0" encoding="UTF-8" ?>
<!-- Written by vla_edge_ros (tools/dds_profile.py, dds.shm_health_check_ms {ms}): Fast DDS's built-in transports with
     shared-memory ports checked for {ms} ms instead of 1000, so a first send to a port waits at most ~{ms // 3} ms. -->
<profiles xmlns="http://www.eprosima.com/XMLSchemas/fastRTPS_Profiles">
  <transport_descriptors>
    <transport_descriptor>
      <transport_id>vla_edge_shm</transport_id>
      <type>SHM</type>
      <healthy_check_timeout_ms>{ms}</healthy_check_timeout_ms>
    </transport_descriptor>
    <transport_descriptor>
      <transport_id>vla_edge_udpv4</transport_id>
      <type>UDPv4</type>
    </transport_descriptor>
  </transport_descriptors>
  <participant profile_name="{escape(PROFILE_NAME)}" is_default_profile="true">
    <rtps>
      <userTransports>
        <transport_id>vla_edge_shm</transport_id>
        <transport_id>vla_edge_udpv4</transport_id>
      </userTransports>
      <useBuiltinTransports>false</useBuiltinTransports>
    </rtps>
  </participant>
</profiles>
"""


def profile_dir() -> Path:
    """This user's folder of written profiles (in the temporary directory)."""
    return Path(tempfile.gettempdir()) / f"vla_edge_fastdds_{os.getuid()}"


def written_here(path: str | os.PathLike, directory: str | os.PathLike | None = None) -> bool:
    """Whether `path` is a profile write_profile made (in `directory`, default profile_dir()): an environment that
    names one got it from an earlier graph of this package, not from the user."""
    p = Path(path)
    return p.parent == Path(directory or profile_dir()) and p.name.startswith("shm_check_") and p.suffix == ".xml"


def write_profile(health_check_ms: int, directory: str | os.PathLike | None = None) -> Path:
    """The profile for health_check_ms in `directory` (default profile_dir()), written whole under a temporary
    name and renamed, so a process starting meanwhile never reads half of it."""
    folder = Path(directory) if directory is not None else profile_dir()
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = folder / f"shm_check_{int(health_check_ms)}ms.xml"
    text = profile_xml(health_check_ms)
    if not path.is_file() or path.read_text() != text:
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        tmp.write_text(text)
        os.replace(tmp, path)
    return path


def use_profile(health_check_ms: int, env, directory: str | os.PathLike | None = None) -> DdsProfile:
    """Name the profile in `env` (a mapping: a child's environment, or os.environ before this process's first
    participant) unless the user chose otherwise there; says what the processes run with."""
    if health_check_ms == 0:
        return DdsProfile(None, "Fast DDS's own transport settings (dds.shm_health_check_ms 0)")
    rmw = env.get("RMW_IMPLEMENTATION", "")
    if rmw and rmw not in FASTDDS_RMWS:
        return DdsProfile(None, f"no Fast DDS profile: RMW_IMPLEMENTATION is {rmw}")
    for var in USER_CHOICE_ENVS:
        if env.get(var) and not (var == PROFILE_ENV and written_here(env[var], directory)):
            return DdsProfile(env.get(PROFILE_ENV) or None,
                              f"the transports {var}={env[var]} chooses, kept (dds.shm_health_check_ms "
                              f"{health_check_ms} not applied)")
    path = write_profile(health_check_ms, directory)
    env[PROFILE_ENV] = str(path)
    return DdsProfile(str(path), f"Fast DDS profile {path}: shared-memory ports checked for {health_check_ms} ms")


def add_arguments(parser) -> None:
    parser.description = ("write the Fast DDS profile the graph runs with (dds.shm_health_check_ms) and print the "
                          "shell line naming it, for a process the graph does not start: eval \"$(vla-edge "
                          "dds-profile)\" before starting it")
    parser.add_argument("--params", metavar="FILE", help="ROS parameter file (default: config/vla_edge.yaml)")
    parser.add_argument("--set", metavar="KEY=VALUE", action="append", default=[],
                        help="override one configuration key, YAML value (repeatable)")


def run(args) -> int:
    from ..config import ConfigError, load
    from .bringup import parse_sets
    try:
        cfg = load(args.params, parse_sets(args.set))
    except ConfigError as exc:
        print(f"vla-edge dds-profile: {exc}", file=sys.stderr)
        return 2
    env = {k: v for k, v in os.environ.items() if k not in USER_CHOICE_ENVS}   # what the graph would write
    chosen = use_profile(cfg.dds.shm_health_check_ms, env)
    print(f"# vla-edge dds-profile: {chosen.describe()}", file=sys.stderr)
    if chosen.path is None:
        return 0                                   # nothing to name: the shell keeps what it has
    print(f"export {PROFILE_ENV}={shlex.quote(chosen.path)}")
    return 0
