#!/usr/bin/env bash
# Generates and builds vla_edge_interfaces (the msg/srv of the graph's internal channels) with
# colcon, ament_cmake and the rosidl generators, all from PyPI wheels, into the virtual
# environment itself (--merge-install --install-base .venv): the typesupport libraries land in
# .venv/lib, which the ROS wheels put on the library path of every Python started from .venv,
# and the Python module in its site-packages, so nodes and tests import it with no setup.bash.
#
# Idempotent and quick on a re-run: nothing is built when no file of vla_edge_interfaces/ is
# newer than the last build and the generated module loads. Needs a C/C++ compiler and the
# Python headers (scripts/bootstrap.sh installs them on Debian).
#   VENV=path    the environment to build with and into (default .venv)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
prefix=$(cd "$VENV" && pwd)
src=vla_edge_interfaces
stamp="$prefix/.vla_edge_interfaces.built"
build=build/vla_edge_interfaces-$(basename "$prefix")

# The C extension is only loaded when a message is first used: _TYPE_SUPPORT tells whether it loads.
loads() {
    "$prefix/bin/python" -c "from vla_edge_interfaces.msg import Frame
type(Frame).__import_type_support__()
assert Frame._TYPE_SUPPORT is not None" >/dev/null 2>&1
}

if [ -f "$stamp" ] && [ -z "$(find "$src" -newer "$stamp" -print -quit)" ] && loads; then
    exit 0
fi

# ament_cmake finds packages through the ament index of AMENT_PREFIX_PATH, which a ROS
# setup.bash would set; here the venv is the only prefix.
log=$(mktemp)
if ! PATH="$prefix/bin:$PATH" AMENT_PREFIX_PATH="$prefix" CMAKE_PREFIX_PATH="$prefix" \
        "$prefix/bin/colcon" --log-base "$build/log" build --base-paths "$src" --build-base "$build" \
        --install-base "$prefix" --merge-install \
        --cmake-args -DBUILD_TESTING=OFF "-DPython3_EXECUTABLE=$prefix/bin/python3" >"$log" 2>&1; then
    cat "$log" >&2
    rm -f "$log"
    echo "build_interfaces: colcon build of $src failed (full log above, colcon's under $build/log)" >&2
    exit 1
fi
rm -f "$log"
if ! loads; then
    echo "build_interfaces: $src built, but 'from vla_edge_interfaces.msg import Frame' does not load its" \
         "typesupport with $prefix/bin/python" >&2
    exit 1
fi
touch "$stamp"
echo "build_interfaces: $src built into $prefix"
