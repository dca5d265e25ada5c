#!/usr/bin/env bash
# Create (or reuse) .venv with CPU torch 2.13.0 and guideloom installed editable with the given extras.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-test}"
say() { echo "setup: $*" >&2; }
say "a .venv with CPU torch 2.13.0 and guideloom[${extras}] (several minutes the first time)"
if [ ! -x .venv/bin/python ]; then
  say "creating .venv"
  python3 -m venv .venv
fi
# shellcheck disable=SC1091
. .venv/bin/activate
say "updating pip"
python -m pip install --quiet --disable-pip-version-check --upgrade pip >/dev/null
# The CPU wheel first: a bare "torch" requirement would pull a multi-GB CUDA build.
if python -c "import torch, sys; sys.exit(torch.__version__ != '2.13.0+cpu')" 2>/dev/null; then
  say "torch 2.13.0 (CPU) is installed"
else
  say "installing torch 2.13.0 (the CPU build)"
  python -m pip install --quiet --disable-pip-version-check "torch==2.13.0"
fi
say "installing guideloom[${extras}] (editable) and its dependencies"
python -m pip install --quiet --disable-pip-version-check -e ".[${extras}]"
say "ready: $(python -c 'import sys; print(sys.executable)')"
# Azurite (Azure Blob Storage's emulator, npm) for the remote tests, into an ignored folder of the repository.
if [ -x .azurite/node_modules/.bin/azurite-blob ]; then
  say "azurite is installed"
elif command -v npm >/dev/null; then
  say "installing azurite (npm) into .azurite/"
  npm install --silent --no-audit --no-fund --prefix .azurite azurite >/dev/null \
    || say "azurite could not be installed: the remote tests on Azure will be skipped"
else
  say "npm not found: the remote tests on Azure (Azurite) will be skipped"
fi
