"""One node table feeds the launch file, `vla-edge bringup` and setup.py's executables.

launch_ros has no PyPI wheel, so the launch file cannot run here. It is checked
twice instead: its syntax tree (it reads `NODES` and names no node itself),
and `generate_launch_description()` executed against minimal recording
stand-ins for the launch / launch_ros classes, to see that every node of the
table becomes one process action and that lifecycle nodes are configured and
then activated.
"""
import ast
import importlib
import runpy
import sys
import types
from pathlib import Path

import pytest
from lifecycle_msgs.msg import Transition

from vla_edge_ros import config as C
from vla_edge_ros.nodes import graph
from vla_edge_ros.tools.bringup import GraphProcesses

ROOT = Path(__file__).resolve().parents[1]
LAUNCH_FILE = ROOT / "launch" / graph.LAUNCH_FILE


def test_launch_file_reads_the_node_table_and_hard_codes_no_node():
    tree = ast.parse(LAUNCH_FILE.read_text())
    imported = {(n.module, a.name) for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}
    assert ("vla_edge_ros.nodes.graph", "NODES") in imported
    literals = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    for spec in graph.NODES:
        named = {spec.name, spec.executable, spec.module} & literals
        assert not named, f"the launch file spells out {named}; it must come from graph.NODES"


class _Recorder:
    """Stands in for a launch / launch_ros class: keeps its arguments."""

    def __init__(self, *args, **kwargs):
        self.args, self.kwargs = args, kwargs


def _stub_modules(share_dir: str) -> dict:
    names = {
        "launch": ["LaunchDescription"],
        "launch.actions": ["DeclareLaunchArgument", "EmitEvent", "LogInfo", "RegisterEventHandler", "OpaqueFunction",
                           "SetEnvironmentVariable", "Shutdown"],
        "launch.event_handlers": ["OnProcessStart"],
        "launch.substitutions": ["LaunchConfiguration"],
        "launch_ros.actions": ["Node", "LifecycleNode"],
        "launch_ros.event_handlers": ["OnStateTransition"],
        "launch_ros.events.lifecycle": ["ChangeState"],
    }
    modules = {}
    for mod_name, classes in names.items():
        mod = types.ModuleType(mod_name)
        for cls in classes:
            setattr(mod, cls, type(cls, (_Recorder,), {}))
        modules[mod_name] = mod
    # LaunchConfiguration(name).perform(context): the stand-in context is a dict of launch arguments.
    modules["launch.substitutions"].LaunchConfiguration.perform = lambda self, context: context[self.args[0]]
    modules["launch.events"] = types.ModuleType("launch.events")
    modules["launch.events"].matches_action = lambda action: ("matches", action)
    modules["launch_ros"] = types.ModuleType("launch_ros")
    modules["launch_ros.events"] = types.ModuleType("launch_ros.events")
    modules["ament_index_python"] = types.ModuleType("ament_index_python")
    modules["ament_index_python.packages"] = types.ModuleType("ament_index_python.packages")
    modules["ament_index_python.packages"].get_package_share_directory = lambda pkg: share_dir
    return modules


def _launch(monkeypatch, tmp_path, params_file):
    """generate_launch_description() and its OpaqueFunction run with params_file:=params_file."""
    for name, module in _stub_modules(str(tmp_path)).items():
        monkeypatch.setitem(sys.modules, name, module)
    description = runpy.run_path(str(LAUNCH_FILE))["generate_launch_description"]()
    top = description.args[0]
    declared = [e for e in top if type(e).__name__ == "DeclareLaunchArgument"]
    assert declared[0].kwargs["default_value"] == str(tmp_path / "config" / graph.PARAMS_FILE)
    (opaque,) = [e for e in top if type(e).__name__ == "OpaqueFunction"]
    return opaque.kwargs["function"]({"params_file": str(params_file)})


def test_launch_description_has_one_process_per_table_row(monkeypatch, tmp_path):
    entities = _launch(monkeypatch, tmp_path, ROOT / "config" / graph.PARAMS_FILE)
    processes = [e for e in entities if type(e).__name__ in ("Node", "LifecycleNode")]
    assert [(p.kwargs["name"], p.kwargs["executable"], type(p).__name__ == "LifecycleNode") for p in processes] == \
        [(s.name, s.executable, s.lifecycle) for s in graph.NODES]
    assert all(p.kwargs["package"] == graph.PACKAGE for p in processes)
    # The table's restart policy: respawn with the supervisor's first backoff, else the launch shuts down.
    for p, spec in zip(processes, graph.NODES):
        if spec.respawn:
            assert p.kwargs["respawn"] is True and p.kwargs["respawn_delay"] == C.load().supervisor.restart_backoff_s
        else:
            assert "respawn" not in p.kwargs and type(p.kwargs["on_exit"][0]).__name__ == "Shutdown"
    # Lifecycle nodes: configure emitted each time the process starts, activate when 'inactive' is reached.
    handlers = [e.args[0] for e in entities if type(e).__name__ == "RegisterEventHandler"]
    for node in (p for p in processes if type(p).__name__ == "LifecycleNode"):
        on_start = [h.kwargs for h in handlers if type(h).__name__ == "OnProcessStart" and h.kwargs["target_action"] is node]
        assert len(on_start) == 1
        event = on_start[0]["on_start"][0].kwargs["event"].kwargs
        assert event == {"lifecycle_node_matcher": ("matches", node), "transition_id": Transition.TRANSITION_CONFIGURE}
        on_inactive = [h.kwargs for h in handlers if type(h).__name__ == "OnStateTransition"
                       and h.kwargs["target_lifecycle_node"] is node and h.kwargs["goal_state"] == "inactive"]
        assert len(on_inactive) == 1
        assert on_inactive[0]["entities"][0].kwargs["event"].kwargs["transition_id"] == Transition.TRANSITION_ACTIVATE


def test_launch_checks_the_parameter_file_before_any_node(monkeypatch, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("/**:\n  ros__parameters:\n    cycle: {deadline_ms: -1.0}\n")
    with pytest.raises(RuntimeError) as err:
        _launch(monkeypatch, tmp_path, bad)
    assert "cycle.deadline_ms must be > 0" in str(err.value) and "\n" not in str(err.value)


def test_bringup_starts_the_same_table(tmp_path):
    procs = GraphProcesses(params_file=ROOT / "config" / graph.PARAMS_FILE, env={})
    assert procs.nodes == graph.NODES
    for spec in procs.nodes:
        argv = spec.command([tmp_path / "p.yaml"], python="python3")
        assert argv[:3] == ["python3", "-m", spec.module]
        assert argv[argv.index("-r") + 1] == f"__node:={spec.name}"
        assert argv[argv.index("--params-file") + 1] == str(tmp_path / "p.yaml")
    procs.stop()


def test_setup_py_installs_every_node_executable():
    tree = ast.parse((ROOT / "setup.py").read_text())
    scripts = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str) and " = " in n.value}
    for spec in graph.NODES:
        assert f"{spec.executable} = {spec.module}:main" in scripts, scripts
        assert callable(importlib.import_module(spec.module).main)


def test_lifecycle_service_names():
    assert [s.name for s in graph.NODES if s.lifecycle] == ["reasoning", "reconciler"], \
        "the nodes that own the GPU are lifecycle nodes"
    assert graph.lifecycle_service(graph.node("reconciler"), "change_state") == "/reconciler/change_state"
    assert graph.lifecycle_service(graph.node("reasoning"), "get_state") == "/reasoning/get_state"
    with pytest.raises(ValueError, match="not a lifecycle node"):
        graph.lifecycle_service(graph.node("camera_ingest"), "change_state")
    with pytest.raises(KeyError, match="no node 'camera'"):
        graph.node("camera")


@pytest.mark.skipif(not Path("/dev/shm").is_dir(), reason="no /dev/shm on this machine")
def test_launch_removes_a_dead_processes_fast_dds_files_before_any_node_and_says_so(monkeypatch, tmp_path):
    shm = Path("/dev/shm")
    dead = shm / "fastrtps_vlaedgelaunch001"            # laid out as a participant's segment: 16 characters
    for path in (dead, shm / (dead.name + "_el")):
        path.write_bytes(b"")                           # its lock file held by nobody: its process is gone
    try:
        entities = _launch(monkeypatch, tmp_path, ROOT / "config" / graph.PARAMS_FILE)
        assert not dead.exists() and not (shm / (dead.name + "_el")).exists()
        first = entities[0]
        assert type(first).__name__ == "LogInfo" and "Fast DDS shared-memory segments" in first.kwargs["msg"]
    finally:
        for path in (dead, shm / (dead.name + "_el")):
            path.unlink(missing_ok=True)


def test_the_nodes_start_with_the_fast_dds_profile_unless_the_environment_chooses(monkeypatch, tmp_path):
    """dds.shm_health_check_ms (tools/dds_profile.py): the profile is named in the environment before the first node
    and said; a profile the launching shell already names is kept, and 0 leaves Fast DDS alone."""
    from vla_edge_ros.tools.dds_profile import PROFILE_ENV
    for var in ("FASTRTPS_DEFAULT_PROFILES_FILE", "FASTDDS_DEFAULT_PROFILES_FILE", "FASTDDS_BUILTIN_TRANSPORTS",
                "RMW_IMPLEMENTATION"):
        monkeypatch.delenv(var, raising=False)
    entities = _launch(monkeypatch, tmp_path, ROOT / "config" / graph.PARAMS_FILE)
    kinds = [type(e).__name__ for e in entities]
    (set_env,) = [e for e in entities if type(e).__name__ == "SetEnvironmentVariable"]
    assert kinds.index("SetEnvironmentVariable") < min(kinds.index(k) for k in ("Node", "LifecycleNode"))
    assert set_env.args[0] == PROFILE_ENV
    text = Path(set_env.args[1]).read_text()
    assert f"<healthy_check_timeout_ms>{C.load().dds.shm_health_check_ms}</healthy_check_timeout_ms>" in text
    said = [e.kwargs["msg"] for e in entities if type(e).__name__ == "LogInfo"]
    assert any("DDS: Fast DDS profile" in m and set_env.args[1] in m for m in said), said

    own = tmp_path / "robot_profile.xml"
    own.write_text("<profiles/>")
    monkeypatch.setenv(PROFILE_ENV, str(own))
    entities = _launch(monkeypatch, tmp_path, ROOT / "config" / graph.PARAMS_FILE)
    assert not [e for e in entities if type(e).__name__ == "SetEnvironmentVariable"]
    said = [e.kwargs["msg"] for e in entities if type(e).__name__ == "LogInfo"]
    assert any(str(own) in m and "kept" in m for m in said), said

    monkeypatch.delenv(PROFILE_ENV)
    off = tmp_path / "off.yaml"
    off.write_text("/**:\n  ros__parameters:\n    dds: {shm_health_check_ms: 0}\n")
    entities = _launch(monkeypatch, tmp_path, off)
    assert not [e for e in entities if type(e).__name__ == "SetEnvironmentVariable"]
