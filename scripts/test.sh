#!/usr/bin/env bash
# The project's test command (README; .ci/run runs exactly this).
#
#   scripts/test.sh                 cargo test --locked, the notebook checker's unit tests, then
#                                   every notebook executed headless at scale `tiny`
#                                   (scripts/run_notebooks.sh: installs the evcxr kernel once and
#                                   builds the notebooks' copy of rankwise; see notebooks/README.md
#                                   for the cost), outputs under target/notebooks/tiny
#   scripts/test.sh --no-notebooks  the same without the notebooks (a quick local loop)
#
# RANKWISE_TEST_NOTEBOOKS=0 has the same effect as --no-notebooks.
set -euo pipefail
cd "$(dirname "$0")/.."

notebooks="${RANKWISE_TEST_NOTEBOOKS:-1}"
for arg in "$@"; do
  case "$arg" in
    --no-notebooks) notebooks=0 ;;
    --notebooks) notebooks=1 ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) echo "scripts/test.sh: unknown argument '$arg' (see --help)" >&2; exit 2 ;;
  esac
done

start=$SECONDS
cargo test --locked
python3 scripts/test_check_notebook.py
echo "[test.sh] cargo test and the checker's tests passed in $((SECONDS - start)) s" >&2
if [[ "$notebooks" == 1 ]]; then
  scripts/run_notebooks.sh --scale tiny --out-dir target/notebooks/tiny
  echo "[test.sh] notebooks at tiny passed; total $((SECONDS - start)) s" >&2
fi
