#!/usr/bin/env bash
# The project's test command (README; .ci/run runs exactly this).
#
#   scripts/test.sh               cargo test --locked + the notebook checker's unit tests
#   scripts/test.sh --notebooks   the same, then every notebook headless at scale `tiny`
#                                 (scripts/run_notebooks.sh; adds the evcxr install and the
#                                 notebooks' own build, see notebooks/README.md for the cost)
#
# RANKWISE_TEST_NOTEBOOKS=1 has the same effect as --notebooks.
set -euo pipefail
cd "$(dirname "$0")/.."

notebooks="${RANKWISE_TEST_NOTEBOOKS:-0}"
for arg in "$@"; do
  case "$arg" in
    --notebooks) notebooks=1 ;;
    -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
    *) echo "scripts/test.sh: unknown argument '$arg' (see --help)" >&2; exit 2 ;;
  esac
done

cargo test --locked
python3 scripts/test_check_notebook.py
if [[ "$notebooks" == 1 ]]; then
  scripts/run_notebooks.sh --scale tiny --out-dir target/notebooks/tiny
fi
