"""Where the package's data files are: config/*.yaml and cuda/*.cu(h).

Two layouts:
    source tree      <repo>/vla_edge_ros/ beside <repo>/config and <repo>/cuda
                     (a checkout, `pip install -e .`)
    installed        <prefix>/lib/python3.X/site-packages/vla_edge_ros and
                     <prefix>/share/vla_edge_ros/{config,cuda} (colcon build,
                     setup.py's data_files), found through the ament index:
                     ament_index_python when it imports, else the prefixes of
                     $AMENT_PREFIX_PATH that hold the package's marker file

The source tree wins when both exist, so a developer's edits are what runs.
No import-time side effects: everything is looked up when asked.
"""
from __future__ import annotations

import os
from pathlib import Path

PACKAGE = "vla_edge_ros"
PACKAGE_ROOT = Path(__file__).resolve().parent
SOURCE_ROOT = PACKAGE_ROOT.parent


class ResourceNotFound(FileNotFoundError):
    """A data directory of the package exists neither in the source tree nor in an installed share/."""


def share_dirs() -> list[Path]:
    """Candidate share/vla_edge_ros directories of installed copies, ament index first."""
    found = []
    try:
        from ament_index_python.packages import PackageNotFoundError, get_package_share_directory
        try:
            found.append(Path(get_package_share_directory(PACKAGE)))
        except (PackageNotFoundError, OSError):     # OSError: AMENT_PREFIX_PATH unset (not a sourced workspace)
            pass
    except ImportError:
        pass
    for prefix in os.environ.get("AMENT_PREFIX_PATH", "").split(os.pathsep):
        if not prefix:
            continue
        marker = Path(prefix) / "share" / "ament_index" / "resource_index" / "packages" / PACKAGE
        if marker.is_file():
            found.append(Path(prefix) / "share" / PACKAGE)
    return list(dict.fromkeys(found))


def data_dir(name: str, must_contain: str) -> Path:
    """<source root>/<name> or <share>/<name>, whichever holds `must_contain` (source tree first)."""
    candidates = [SOURCE_ROOT / name]
    if (candidates[0] / must_contain).is_file():
        return candidates[0]
    candidates += [d / name for d in share_dirs()]
    for directory in candidates[1:]:
        if (directory / must_contain).is_file():
            return directory
    raise ResourceNotFound(f"{name}/{must_contain} not found; looked in {[str(c) for c in candidates]} "
                           f"(an installed package is found through the ament index: source its setup.bash "
                           f"or set AMENT_PREFIX_PATH)")


def kernel_dir() -> Path:
    """The directory of the CUDA kernel sources (cuda/*.cu and the *.cuh headers they include)."""
    return data_dir("cuda", "common.cuh")


def config_dir() -> Path:
    """The directory of the parameter files (config/vla_edge.yaml, presets)."""
    return data_dir("config", "vla_edge.yaml")
