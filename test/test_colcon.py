"""`colcon build` builds and installs the package as a robot's workspace would (ament_python).

colcon is not a runtime dependency: the test runs when a `colcon` executable
(with colcon-ros and colcon-python-setup-py) is on PATH, in .venv/bin, or named
by $COLCON, and is skipped otherwise.
"""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from vla_edge_ros.model.kernel_constants import header_values
from vla_edge_ros.nodes import graph

ROOT = Path(__file__).resolve().parents[1]
SKIP_DIRS = {".venv", ".git", "models", "out", "build", "install", "log", "__pycache__", ".pytest_cache"}


def _colcon() -> str | None:
    candidates = [os.environ.get("COLCON"), shutil.which("colcon"), str(ROOT / ".venv" / "bin" / "colcon")]
    return next((c for c in candidates if c and Path(c).is_file()), None)


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    colcon = _colcon()
    if colcon is None:
        pytest.skip("no colcon executable (pip install colcon-core colcon-ros colcon-python-setup-py, or set $COLCON)")
    ws = tmp_path_factory.mktemp("ws")
    shutil.copytree(ROOT, ws / "src" / graph.PACKAGE,
                    ignore=lambda d, names: [n for n in names if n in SKIP_DIRS or n.endswith(".egg-info")])
    done = subprocess.run([colcon, "build", "--base-paths", "src"], cwd=ws, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return ws / "install" / graph.PACKAGE


def test_share_files_installed(installed):
    share = installed / "share" / graph.PACKAGE
    for rel in ("package.xml", f"launch/{graph.LAUNCH_FILE}", f"config/{graph.PARAMS_FILE}"):
        assert (share / rel).is_file(), rel
        assert (share / rel).read_bytes() == (ROOT / rel).read_bytes()
    assert (installed / "share" / "ament_index" / "resource_index" / "packages" / graph.PACKAGE).is_file()
    assert sorted(p.name for p in (share / "cuda").iterdir()) == sorted(p.name for p in (ROOT / "cuda").iterdir()
                                                                       if p.suffix in (".cu", ".cuh"))


def test_node_executables_installed_where_ros2_run_looks(installed):
    lib = installed / "lib" / graph.PACKAGE           # `ros2 run vla_edge_ros <executable>` looks here
    for spec in graph.NODES:
        script = lib / spec.executable
        assert script.is_file() and os.access(script, os.X_OK), script
        assert f"'console_scripts','{spec.executable}'" in script.read_text()
    assert (lib / "vla-edge").is_file()


def test_installed_package_imports_and_finds_its_config(installed):
    site = next(installed.glob("lib/python3*/site-packages"))
    env = {**os.environ, "PYTHONPATH": str(site), "AMENT_PREFIX_PATH": str(installed)}
    code = ("import vla_edge_ros, vla_edge_ros.config as c, vla_edge_ros.nodes.reasoning as r; "
            "print(vla_edge_ros.__file__); print(c.default_config_path()); print(callable(r.main))")
    done = subprocess.run([sys.executable, "-c", code], cwd=installed, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    module_file, config_path, has_main = done.stdout.split()
    assert Path(module_file).is_relative_to(site)
    assert Path(config_path) == installed / "share" / graph.PACKAGE / "config" / graph.PARAMS_FILE
    assert has_main == "True"


def test_installed_package_finds_its_kernels_through_the_ament_index(installed):
    """An installed (non-source) package finds cuda/*.cu and the headers they include under share/ via the
    ament index, not next to site-packages, and reads the shared constants from its common.cuh; without
    the index it says where it looked and how to fix it."""
    site = next(installed.glob("lib/python3*/site-packages"))
    code = ("from vla_edge_ros.resources import kernel_dir; from vla_edge_ros.model import cuda_kernels as ck; "
            "print(kernel_dir()); print(len(ck.family_source('projection_bf16'))); print(ck.MODE_QKV_ROPE)")
    env = {**os.environ, "PYTHONPATH": str(site), "AMENT_PREFIX_PATH": str(installed)}
    done = subprocess.run([sys.executable, "-c", code], cwd=installed, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    directory, length, mode = done.stdout.split()
    assert Path(directory) == installed / "share" / graph.PACKAGE / "cuda"
    assert int(length) > 0          # projection_bf16.cu includes common.cuh and mma_bf16.cuh: both installed
    assert int(mode) == header_values(ROOT / "cuda" / "common.cuh")["MODE_QKV_ROPE"]
    env.pop("AMENT_PREFIX_PATH")
    done = subprocess.run([sys.executable, "-c", code], cwd=installed, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "ament index" in done.stderr and "AMENT_PREFIX_PATH" in done.stderr, done.stderr[-2000:]


def _ament_cmake_prefix() -> Path | None:
    """The prefix holding ament_cmake and the rosidl generators (the venv, from PyPI), if there is one."""
    prefix = Path(sys.prefix)
    return prefix if (prefix / "share" / "ament_cmake" / "cmake").is_dir() else None


def test_interface_package_builds_beside_the_package_as_a_ros_workspace_does(tmp_path):
    """The README's robot command finds both packages (vla_edge_interfaces lies inside this repository,
    where colcon's crawl stops at vla_edge_ros), and the interface package generates, compiles and
    installs a module whose typesupport loads and whose messages serialize."""
    colcon, prefix = _colcon(), _ament_cmake_prefix()
    if colcon is None or prefix is None:
        pytest.skip("no colcon, or no ament_cmake + rosidl generators in this environment (requirements.txt has them)")
    ws = tmp_path / "ws"
    shutil.copytree(ROOT, ws / "src" / graph.PACKAGE,
                    ignore=lambda d, names: [n for n in names if n in SKIP_DIRS or n.endswith(".egg-info")])
    base_paths = [f"src/{graph.PACKAGE}/vla_edge_interfaces", f"src/{graph.PACKAGE}"]
    # What a ROS setup.bash provides: the ament index and CMake packages of the underlay (here the venv).
    env = {**os.environ, "AMENT_PREFIX_PATH": str(prefix), "CMAKE_PREFIX_PATH": str(prefix),
           "PATH": f"{prefix / 'bin'}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run([colcon, "build", "--base-paths", *base_paths,
                           "--cmake-args", "-DBUILD_TESTING=OFF", f"-DPython3_EXECUTABLE={sys.executable}"],
                          cwd=ws, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for package in (graph.PACKAGE, "vla_edge_interfaces"):          # both found, both built
        assert (ws / "install" / package / "share" / package / "package.xml").is_file(), done.stdout[-3000:]
    installed = ws / "install" / "vla_edge_interfaces"
    site = next(installed.glob("lib/python3*/site-packages"))
    code = ("from rclpy.serialization import serialize_message as s, deserialize_message as d; "
            "import vla_edge_interfaces; from vla_edge_interfaces.msg import StateChunk; "
            "print(d(s(StateChunk(seq=7)), StateChunk).seq, vla_edge_interfaces.__file__)")
    # As `source install/setup.bash` would set them (the venv's own lib/ is already on LD_LIBRARY_PATH).
    run_env = {**env, "PYTHONPATH": str(site), "AMENT_PREFIX_PATH": f"{installed}{os.pathsep}{prefix}",
               "LD_LIBRARY_PATH": f"{installed / 'lib'}{os.pathsep}{os.environ.get('LD_LIBRARY_PATH', '')}"}
    loaded = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=run_env, capture_output=True, text=True,
                            timeout=120)
    assert loaded.returncode == 0, loaded.stderr[-3000:]
    seq, module_file = loaded.stdout.split()
    assert seq == "7" and Path(module_file).is_relative_to(site), loaded.stdout    # the workspace's, not .venv's
