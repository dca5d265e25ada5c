#!/usr/bin/env bash
# Install the peer data loaders that the benchmarks compare guideloom against.
#
# Creates .venv-bench at the repository root (kept apart from the dev venv),
# installs the CPU build of torch first, then each peer on its own with the
# constraints in benchmarks/peers/constraints.txt, so that one peer failing to
# install never blocks the others. The outcome for every peer ("ok" or the
# reason it is unusable) is written to benchmarks/peers/install_status.json.
# Finally the project itself is installed into the venv in editable mode.
#
# Re-running is cheap: a peer whose requirement and constraints have not
# changed since its last attempt is not handed to pip again. Set
# PEERS_RETRY_FAILED=1 to retry peers that failed last time, or PEERS_FORCE=1
# to re-run pip for every peer.
#
# Usage: bash benchmarks/install_peers.sh
#   env: PYTHON (default python3.11), BENCH_VENV (default <repo>/.venv-bench)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${BENCH_VENV:-$ROOT/.venv-bench}"
PEERS_DIR="$ROOT/benchmarks/peers"
CONSTRAINTS="$PEERS_DIR/constraints.txt"
STATUS_FILE="$PEERS_DIR/install_status.json"
PYTHON="${PYTHON:-python3.11}"
TORCH_VERSION="2.13.0"

# distribution name | pip requirement
PEERS=(
  "litdata|litdata"
  "mosaicml-streaming|mosaicml-streaming"
  "datasets|datasets"
  "grain|grain"
  "torchdata|torchdata"
  "webdataset|webdataset"
  "soundfile|soundfile"
  "megatron-energon|megatron-energon"
)

log() { printf '[install_peers] %s\n' "$*" >&2; }

if ! grep -qE "^torch==${TORCH_VERSION}\$" "$CONSTRAINTS"; then
  log "constraints file must pin torch==${TORCH_VERSION}: $CONSTRAINTS"
  exit 1
fi

if [[ ! -x "$VENV/bin/python" ]]; then
  log "creating $VENV with $PYTHON"
  "$PYTHON" -m venv "$VENV"
fi
PY="$VENV/bin/python"
STAMPS="$VENV/.peer-stamps"
LOGS="$VENV/.peer-logs"
mkdir -p "$STAMPS" "$LOGS"

pip_install() { "$PY" -m pip install --disable-pip-version-check -c "$CONSTRAINTS" "$@"; }

# 1. torch, the CPU build pinned by the constraints file.
installed_torch="$("$PY" -c 'import importlib.metadata as m; print(m.version("torch"))' 2>/dev/null || true)"
if [[ "${installed_torch%%+*}" != "$TORCH_VERSION" ]]; then
  log "installing torch==${TORCH_VERSION}"
  pip_install "torch==${TORCH_VERSION}"
else
  log "torch ${installed_torch} already installed"
fi

# 2. The peers, one pip call each.
constraints_hash="$(sha256sum "$CONSTRAINTS" | cut -d' ' -f1)"
declare -A PIP_RESULT=()
for entry in "${PEERS[@]}"; do
  dist="${entry%%|*}"
  req="${entry#*|}"
  stamp_file="$STAMPS/$dist"
  want="$constraints_hash $req"
  if [[ -f "$stamp_file" && -z "${PEERS_FORCE:-}" ]]; then
    IFS= read -r have <"$stamp_file" || have=""
    prev="$(sed -n '2,$p' "$stamp_file")"
    if [[ "$have" == "$want" ]] && { [[ "$prev" == "ok" ]] || [[ -z "${PEERS_RETRY_FAILED:-}" ]]; }; then
      log "$dist: unchanged since last attempt (${prev:0:60})"
      PIP_RESULT[$dist]="$prev"
      continue
    fi
  fi
  log "$dist: pip install $req (log: $LOGS/$dist.log)"
  if pip_install "$req" >"$LOGS/$dist.log" 2>&1; then
    result="ok"
  else
    # Keep the most telling line of pip's output as the reason.
    reason="$(grep -E '^ERROR' "$LOGS/$dist.log" | head -n 1 || true)"
    [[ -n "$reason" ]] || reason="$(tail -n 1 "$LOGS/$dist.log")"
    result="pip install failed: ${reason}"
    log "$dist: $result"
  fi
  PIP_RESULT[$dist]="$result"
  printf '%s\n%s\n' "$want" "$result" >"$stamp_file"
done

# Nothing a peer pulled in may have replaced the CPU torch build.
final_torch="$("$PY" -c 'import torch; print(torch.__version__)')"
if [[ "${final_torch%%+*}" != "$TORCH_VERSION" ]]; then
  log "torch changed to $final_torch; the constraints file is not doing its job"
  exit 1
fi

# Informational: whether the peers' declared requirements still agree.
"$PY" -m pip check >"$LOGS/pip-check.log" 2>&1 || log "pip check reports conflicts (see $LOGS/pip-check.log):
$(cat "$LOGS/pip-check.log")"

# 3. Import check through the adapters; writes install_status.json.
args=()
for dist in "${!PIP_RESULT[@]}"; do
  args+=("$dist=${PIP_RESULT[$dist]}")
done
(cd "$ROOT" && "$PY" -m benchmarks.peers.check_install --out "$STATUS_FILE" "${args[@]}")

# 4. The project itself, without letting pip touch its dependencies.
if [[ -f "$ROOT/src/guideloom/__init__.py" ]]; then
  if "$PY" -c 'import importlib.metadata as m, sys; sys.exit(0 if m.version("guideloom") else 1)' 2>/dev/null \
      && "$PY" -c 'import guideloom, pathlib, sys; sys.exit(0 if pathlib.Path(guideloom.__file__).resolve().is_relative_to(pathlib.Path(sys.argv[1]).resolve()) else 1)' "$ROOT/src"; then
    log "guideloom already installed in editable mode"
  else
    log "installing guideloom (editable, --no-deps) and msgpack for its MessagePack format"
    (cd "$ROOT" && pip_install -e . --no-deps && pip_install msgpack)
  fi
else
  log "src/guideloom/__init__.py does not exist yet; guideloom not installed into $VENV (re-run later)"
fi

log "done; status in ${STATUS_FILE#"$ROOT"/}"
cat "$STATUS_FILE"
