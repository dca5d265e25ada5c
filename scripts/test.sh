#!/usr/bin/env bash
# The whole test suite, from nothing: set up .venv, then run pytest (the slow campaigns in a second call).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh test
. .venv/bin/activate
python -m pytest -q -m "not slow" "$@"
# Exit 5 means no test is marked slow (or none was selected): nothing failed.
python -m pytest -q -m slow "$@" || { status=$?; [ "$status" -eq 5 ] || exit "$status"; }
