#!/usr/bin/env bash
# Runs the training-throughput comparison of benches/train_throughput_vs_torch.md back to back:
# rankwise with and without the allocator tuning, then PyTorch, for each model (2 threads,
# batch 64). Usage: benches/train_throughput_vs_torch.sh [python with torch+torchvision]
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${1:-/work/venv-torch/bin/python}
export RAYON_NUM_THREADS=2 OMP_NUM_THREADS=2
cargo build --release --locked --example train_throughput
EX=target/release/examples/train_throughput
for spec in "small 32 20" "resnet18 224 3" "resnet50 224 2"; do
  set -- $spec
  "$EX" --model "$1" --size "$2" --batch 64 --steps "$3"
  "$EX" --model "$1" --size "$2" --batch 64 --steps "$3" --no-malloc-tuning
  "$PY" benches/train_throughput_vs_torch.py --model "$1" --size "$2" --batch 64 --steps "$3" --threads 2
done
