#!/usr/bin/env bash
# Executes the evcxr notebooks in notebooks/ headless, installing what is missing first.
#
#   scripts/run_notebooks.sh [--scale tiny|quick|standard|paper] [--out-dir DIR] [--cell-timeout S] [NOTEBOOK...]
#
# --scale      passed to the notebooks as RANKWISE_SCALE (default: quick).
# --out-dir    write the executed notebooks to DIR/notebooks/ and let the notebooks write their
#              tables and figures under DIR (RANKWISE_OUTPUT_DIR=DIR). Without it the notebooks
#              are executed in place and regenerate paper_tables/ and figures/ of the repository.
# --cell-timeout  seconds one cell may run before the run fails (default 10800: the first cell of a
#              cold run compiles rankwise, which took over an hour on a heavily loaded machine).
# NOTEBOOK...  default: every notebooks/*.ipynb, in name order.
#
# Installs into git-ignored folders of the repository, nothing under $HOME:
#   .venv-notebooks/        Python venv (notebooks/requirements.txt: nbclient, jupyter_client)
#                           + evcxr_jupyter (cargo install --root) + the `rust` kernel spec;
#   target/notebooks/{fast-compile,optimised}/evcxr  EVCXR_TMPDIR: evcxr's build folder (one per
#                           cargo profile: tiny / quick and paper), kept so that later runs and later
#                           notebooks start warm.
# A cold idle 2-core machine spends ~6 min installing evcxr_jupyter, then ~4 min (tiny) in the
# first notebook (evcxr compiles rankwise and its dependencies; longer at quick); see
# notebooks/README.md for measured times. Exit status non-zero if any notebook failed, including
# a panic or an error printed by a cell (scripts/check_notebook.py).
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
EVCXR_VERSION="0.22.0"
VENV="$ROOT/.venv-notebooks"
START=$SECONDS

log() { printf '[notebooks %dm%02ds] %s\n' $(((SECONDS - START) / 60)) $(((SECONDS - START) % 60)) "$*" >&2; }
die() { log "error: $*"; exit 1; }

scale="quick"
out_dir=""
cell_timeout=10800
notebooks=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --scale) scale="${2:?--scale needs a value}"; shift 2 ;;
    --scale=*) scale="${1#*=}"; shift ;;
    --out-dir) out_dir="${2:?--out-dir needs a value}"; shift 2 ;;
    --out-dir=*) out_dir="${1#*=}"; shift ;;
    --cell-timeout) cell_timeout="${2:?--cell-timeout needs a value}"; shift 2 ;;
    --cell-timeout=*) cell_timeout="${1#*=}"; shift ;;
    -h|--help) sed -n '2,24p' "$0"; exit 0 ;;
    -*) die "unknown option $1 (see --help)" ;;
    *) notebooks+=("$1"); shift ;;
  esac
done
case "$scale" in tiny|quick|standard|paper) ;; *) die "--scale must be tiny, quick, standard or paper, got '$scale'" ;; esac
if [[ ${#notebooks[@]} -eq 0 ]]; then
  notebooks=("$ROOT"/notebooks/*.ipynb)
  [[ -e "${notebooks[0]}" ]] || die "no notebooks in $ROOT/notebooks"
fi
for nb in "${notebooks[@]}"; do [[ -f "$nb" ]] || die "no such notebook: $nb"; done
command -v cargo >/dev/null || die "cargo not found: install Rust with rustup first"
command -v python3 >/dev/null || die "python3 not found"

# 1. Python side: a venv with the pinned headless runner.
if [[ ! -x "$VENV/bin/python" ]]; then
  log "creating the Python venv $VENV"
  python3 -m venv "$VENV"
fi
if ! cmp -s "$ROOT/notebooks/requirements.txt" "$VENV/.requirements.installed"; then
  log "installing notebooks/requirements.txt into the venv"
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -r "$ROOT/notebooks/requirements.txt"
  cp "$ROOT/notebooks/requirements.txt" "$VENV/.requirements.installed"
fi

# 2. The Rust kernel, built once into the venv (cargo install writes $VENV/bin/evcxr_jupyter).
if ! grep -qs "^\"evcxr_jupyter $EVCXR_VERSION " "$VENV/.crates.toml" || [[ ! -x "$VENV/bin/evcxr_jupyter" ]]; then
  log "installing evcxr_jupyter $EVCXR_VERSION (cargo install, about 8 min on 2 cores; once per machine)"
  cargo install evcxr_jupyter --version "$EVCXR_VERSION" --locked --root "$VENV"
fi
# The kernel spec goes into the venv's Jupyter data folder, which the venv's jupyter_client
# searches; JUPYTER_PATH tells evcxr_jupyter --install where that is.
export JUPYTER_PATH="$VENV/share/jupyter"
if [[ ! -f "$JUPYTER_PATH/kernels/rust/kernel.json" ]] ||
   ! grep -qs "$VENV/bin/evcxr_jupyter" "$JUPYTER_PATH/kernels/rust/kernel.json"; then
  log "registering the rust kernel in $JUPYTER_PATH"
  "$VENV/bin/evcxr_jupyter" --install >/dev/null
fi

# 3. evcxr's environment. One build folder per cargo profile, so that switching scales does not
# rebuild: `tiny` (CI) compiles rankwise and its dependencies as cheaply as possible and runs them
# slowly; `quick` and `paper` use evcxr's optimised build (notebooks/README.md has the costs).
case "$scale" in
  tiny) build="fast-compile"; profile="cargo-config-tiny.toml" ;;
  *) build="optimised"; profile="cargo-config.toml" ;;
esac
BUILD="$ROOT/target/notebooks/$build"
export EVCXR_TMPDIR="$BUILD/evcxr"
export EVCXR_CONFIG_DIR="$ROOT/notebooks/evcxr"     # init.evcxr: a panic fails the cell
export JUPYTER_RUNTIME_DIR="$ROOT/target/notebooks/jupyter-runtime"
export JUPYTER_PLATFORM_DIRS=1
mkdir -p "$EVCXR_TMPDIR" "$JUPYTER_RUNTIME_DIR"
# evcxr resolves the notebook's dependencies itself, without our Cargo.lock: start from it so the
# notebooks build the same versions that `cargo test --locked` tested.
cp "$ROOT/Cargo.lock" "$EVCXR_TMPDIR/Cargo.lock"
# Cargo reads .cargo/config.toml from the folders above evcxr's build folder: the profile the
# notebooks are compiled with (see notebooks/README.md for why these settings).
mkdir -p "$BUILD/.cargo"
cp "$ROOT/notebooks/evcxr/$profile" "$BUILD/.cargo/config.toml"

export RANKWISE_SCALE="$scale"
args=(--cell-timeout "$cell_timeout")
if [[ -n "$out_dir" ]]; then
  mkdir -p "$out_dir"
  out_dir="$(cd "$out_dir" && pwd)"
  export RANKWISE_OUTPUT_DIR="$out_dir"
  args+=(--out-dir "$out_dir/notebooks")
else
  export RANKWISE_OUTPUT_DIR="$ROOT"
fi

log "executing ${#notebooks[@]} notebook(s) at scale '$scale', outputs under $RANKWISE_OUTPUT_DIR"
status=0
"$VENV/bin/python" "$ROOT/scripts/execute_notebooks.py" "${args[@]}" "${notebooks[@]}" || status=$?
if [[ $status -eq 0 ]]; then
  log "all notebooks ran clean"
else
  log "FAILED: see the problems above"
fi
exit $status
