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
            "print(kernel_dir()); print(len(ck.family_source('projection_fused'))); print(ck.MODE_QKV_ROPE)")
    env = {**os.environ, "PYTHONPATH": str(site), "AMENT_PREFIX_PATH": str(installed)}
    done = subprocess.run([sys.executable, "-c", code], cwd=installed, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    directory, length, mode = done.stdout.split()
    assert Path(directory) == installed / "share" / graph.PACKAGE / "cuda"
    assert int(length) > 0          # projection_fused.cu includes common.cuh and mma_bf16.cuh: both installed
    assert int(mode) == header_values(ROOT / "cuda" / "common.cuh")["MODE_QKV_ROPE"]
    env.pop("AMENT_PREFIX_PATH")
    done = subprocess.run([sys.executable, "-c", code], cwd=installed, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "ament index" in done.stderr and "AMENT_PREFIX_PATH" in done.stderr, done.stderr[-2000:]
