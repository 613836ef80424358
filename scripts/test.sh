#!/usr/bin/env bash
# The project's test command (README; .ci/run runs exactly this).
#
#   scripts/test.sh                 cargo test --locked, the notebook checker's unit tests, the
#                                   extension check (scripts/extension_check.sh), then
#                                   every notebook executed headless at scale `tiny`
#                                   (scripts/run_notebooks.sh: installs the evcxr kernel once and
#                                   builds the notebooks' copy of rankwise; see notebooks/README.md
#                                   for the cost), outputs under target/notebooks/tiny
#   scripts/test.sh --no-notebooks  the same without the notebooks (a quick local loop)
#   scripts/test.sh --no-cuda       without the compile check of the `cuda` and `cudnn` features
#                                   (scripts/build_cuda.sh --check: `cargo check --features cuda,cudnn`
#                                   with a stub nvcc, no toolkit needed, so that the GPU path
#                                   cannot rot on machines without a GPU)
#
# RANKWISE_TEST_NOTEBOOKS=0 has the same effect as --no-notebooks, RANKWISE_TEST_CUDA=0 as
# --no-cuda.
set -euo pipefail
cd "$(dirname "$0")/.."

notebooks="${RANKWISE_TEST_NOTEBOOKS:-1}"
cuda="${RANKWISE_TEST_CUDA:-1}"
for arg in "$@"; do
  case "$arg" in
    --no-notebooks) notebooks=0 ;;
    --notebooks) notebooks=1 ;;
    --no-cuda) cuda=0 ;;
    -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
    *) echo "scripts/test.sh: unknown argument '$arg' (see --help)" >&2; exit 2 ;;
  esac
done

start=$SECONDS
# The paper and dataset modules (src/experiments/<key>.rs, src/data/loaders/<name>.rs) reach the
# crate through build.rs's generated `include!`, which rustfmt does not follow: `cargo fmt`
# leaves them out, so check them by name.
if command -v rustfmt >/dev/null 2>&1; then
  rustfmt --edition 2021 --check src/experiments/*.rs src/data/loaders/*.rs scripts/extension/*.rs
else
  echo "[test.sh] rustfmt not installed: the paper modules' formatting is not checked" >&2
fi
cargo test --locked
# The `hub` feature's download path (models::pretrained) end to end, against a local HTTP server
# on 127.0.0.1 standing for the Hugging Face Hub (tests/hub.rs; no network, no proxy).
cargo test --locked --features hub --test hub
python3 scripts/test_check_notebook.py
# The GPU check program (examples/gpu_check.rs), run with the CPU as its "device" at a small
# size: every check it makes must pass CPU against CPU, so that a GPU session spends its minutes
# on the GPU, not on this program's bugs.
rm -rf target/gpu_check_cpu
cargo run --locked --example gpu_check -- --device cpu --small --out target/gpu_check_cpu
python3 - target/gpu_check_cpu/gpu_check.json <<'EOF2'
import json, sys
doc = json.load(open(sys.argv[1]))
bad = [c for c in doc["checks"] + doc["benchmarks"] if c["status"] not in ("pass", "ok")]
assert not bad and doc["summary"]["pass"] > 0, bad or doc["summary"]
EOF2
# Adding a loss touches 2 files, a paper 4 (issue #23): the examples of scripts/extension/
# added to a scratch copy, counted, built and tested.
scripts/extension_check.sh
# The committed standard run cache: save and load round trip (scripts/standard_runs.sh).
scripts/test_standard_runs.sh
echo "[test.sh] cargo test and the checker's tests passed in $((SECONDS - start)) s" >&2
if [[ "$cuda" == 1 ]]; then
  scripts/build_cuda.sh --check
  echo "[test.sh] the cuda feature compiles; total $((SECONDS - start)) s" >&2
fi
if [[ "$notebooks" == 1 ]]; then
  scripts/run_notebooks.sh --scale tiny --out-dir target/notebooks/tiny
  echo "[test.sh] notebooks at tiny passed; total $((SECONDS - start)) s" >&2
fi
