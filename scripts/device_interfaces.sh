#!/usr/bin/env bash
# Builds vla_edge_interfaces for the GPU machine and puts it in .whl/iface/, beside what
# ../shared/device/prepare.sh --ros carries there.
#
# Why here: the device runs Python 3.12 with the ROS 2 runtime wheels only (no ament_cmake,
# no rosidl generators, no network), so it cannot generate the package; the build machine
# can, with a Python 3.12 (PY312, default python3.12 on PATH) and the cp312 wheels from PyPI
# at the versions requirements.txt pins. The generated libraries need nothing newer than
# the manylinux_2_28 ROS wheels they link against.
#
# Use, from the repository root (after prepare.sh --ros, which empties .whl/ros only):
#   scripts/device_interfaces.sh
#   device command: source .whl/on-device.sh && source .whl/iface/env.sh && ...
# .whl/iface is ~1 MB. The build environment stays in build/venv312 (reused next time).
set -euo pipefail
cd "$(dirname "$0")/.."
PY312=${PY312:-python3.12}
venv=build/venv312
if [ ! -x "$venv/bin/python" ]; then
    "$PY312" -m venv "$venv"
fi
# The build's needs: the generator and ament wheels, colcon, cmake, numpy (its headers), rclpy's messages.
grep -E '^(ros-jazzy-|colcon-|cmake==|numpy)' requirements.txt > build/requirements-interfaces.txt
"$venv/bin/python" -m pip install -q --upgrade pip
"$venv/bin/python" -m pip install -q -r build/requirements-interfaces.txt
VENV="$venv" bash scripts/build_interfaces.sh

prefix=$(cd "$venv" && pwd)
out=.whl/iface
rm -rf "$out" && mkdir -p "$out/lib" "$out/site" "$out/share"
cp -a "$prefix"/lib/libvla_edge_interfaces__*.so "$out/lib/"
cp -a "$prefix"/lib/python3.12/site-packages/vla_edge_interfaces "$out/site/"
cp -a "$prefix"/share/vla_edge_interfaces "$out/share/"
mkdir -p "$out/share/ament_index/resource_index/packages"
cp -a "$prefix"/share/ament_index/resource_index/packages/vla_edge_interfaces \
    "$out/share/ament_index/resource_index/packages/" 2>/dev/null || true
cat > "$out/env.sh" <<'EOF'
# Sourced on the device after .whl/on-device.sh: the cp312 build of vla_edge_interfaces on the paths.
_iface=$(pwd)/.whl/iface
export PYTHONPATH=$_iface/site:$PYTHONPATH
export LD_LIBRARY_PATH=$_iface/lib:${LD_LIBRARY_PATH:-}
export AMENT_PREFIX_PATH=$_iface${AMENT_PREFIX_PATH:+:$AMENT_PREFIX_PATH}
# A build older than the definitions beside it would fail only inside a node (a field it lacks): say so now.
for _f in vla_edge_interfaces/msg/*.msg vla_edge_interfaces/srv/*.srv; do
    cmp -s "$_f" "$_iface/share/$_f" || {
        echo "vla_edge_interfaces in .whl/iface was built from another $_f: run scripts/device_interfaces.sh"
        return 1; }
done
python3 -c "from vla_edge_interfaces.msg import Frame; type(Frame).__import_type_support__(); \
assert Frame._TYPE_SUPPORT is not None; print('vla_edge_interfaces ok')" || return 1
EOF
du -sh "$out"
echo "ready: device commands start with: source .whl/on-device.sh && source .whl/iface/env.sh &&"
