#!/usr/bin/env bash
# Create (or reuse) .venv with CPU torch 2.13.0 and guideloom installed editable with the given extras.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-test}"
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
# shellcheck disable=SC1091
. .venv/bin/activate
python -m pip install --quiet --disable-pip-version-check --upgrade pip >/dev/null
# The CPU wheel first: a bare "torch" requirement would pull a multi-GB CUDA build.
python -c "import torch, sys; sys.exit(torch.__version__ != '2.13.0+cpu')" 2>/dev/null \
  || python -m pip install --quiet --disable-pip-version-check "torch==2.13.0"
python -m pip install --quiet --disable-pip-version-check -e ".[${extras}]"
