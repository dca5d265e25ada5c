#!/usr/bin/env bash
# The whole test suite, from nothing: set up .venv, then run pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh test
. .venv/bin/activate
python -m pytest -q "$@"
