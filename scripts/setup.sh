#!/usr/bin/env bash
# Idempotent set-up: a virtual environment in .venv with CPU torch (on machines without a GPU)
# and the project with the extras the tests and the default campaign need. A second run that finds
# nothing changed returns in about a second.
set -euo pipefail
cd "$(dirname "$0")/.."

PY="${PYTHON:-python3}"
"$PY" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' \
  || { echo "setup: Python >= 3.11 is needed (found $("$PY" --version 2>&1)); set PYTHON=..." >&2; exit 1; }

if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv"
  "$PY" -m venv .venv
fi
VPY=.venv/bin/python
EXTRAS="${EVOTRAINER_EXTRAS:-train,notebook,code,agent,dev}"

# Re-install only when the dependency list or the extras changed.
stamp=".venv/.evotrainer-setup"
want="$(sha256sum pyproject.toml | cut -c1-16) $EXTRAS"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi

if ! command -v nvidia-smi >/dev/null 2>&1; then
  # CPU machine: this exact pin has a CPU wheel; anything else pulls gigabytes of CUDA packages.
  "$VPY" -m pip install -q torch==2.13.0
fi
"$VPY" -m pip install -q -e ".[$EXTRAS]"
echo "$want" > "$stamp"
echo "setup: .venv ready ($("$VPY" -c 'import torch, trl; print("torch", torch.__version__, "trl", trl.__version__)'))"
