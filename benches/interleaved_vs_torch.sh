#!/usr/bin/env bash
# Interleaved rounds of the losses benchmark: for each loss, ROUNDS times one rankwise process
# then one PyTorch process (each timing its steady state, see losses_vs_torch.md), so both sides
# see the same state of the machine. The 2-core VM has windows of seconds to minutes in which a
# 2-thread step runs up to twice as slow; a single run per side can fall on either side of one.
#
#   benches/interleaved_vs_torch.sh [--batch B] [--rounds N] [--baseline BIN] [LOSS ...]
#
# Defaults: B = 256, 5 rounds, every loss. --baseline BIN: a loss_bench binary of other code (an
# earlier commit's, copied aside before rebuilding) run first in every round, for a before/after
# beside the anchor in the same rounds. Needs the bench binary
# (`cargo bench --bench loss_bench --no-run`) and PyTorch (TORCH_PYTHON, default
# /work/venv-torch/bin/python, else python3). Prints one line per round and, per loss, the
# median and the range of PyTorch ÷ rankwise; the JSON lines go to target/interleaved/.
set -euo pipefail
cd "$(dirname "$0")/.."

batch=256
rounds=5
baseline=
losses=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --batch) batch="$2"; shift 2 ;;
    --rounds) rounds="$2"; shift 2 ;;
    --baseline) baseline="$2"; shift 2 ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    -*) echo "interleaved_vs_torch.sh: unknown option '$1'" >&2; exit 2 ;;
    *) losses+=("$1"); shift ;;
  esac
done
if [[ ${#losses[@]} -eq 0 ]]; then
  losses=(smooth-ap happier roadmap fastap rambo contrastive triplet-semihard nsm proxy-nca-pp proxy-nca csl)
fi

if [[ -n "$baseline" && ! -x "$baseline" ]]; then
  echo "interleaved_vs_torch.sh: --baseline '$baseline' is not an executable" >&2; exit 2
fi
python="${TORCH_PYTHON:-/work/venv-torch/bin/python}"
[[ -x "$python" ]] || python=python3
bench=$(cargo bench --bench loss_bench --no-run --message-format=json 2>/dev/null \
  | python3 -c "import sys,json
for l in sys.stdin:
    m=json.loads(l)
    if m.get('reason')=='compiler-artifact' and m['target']['name']=='loss_bench' and m.get('executable'):
        print(m['executable'])")
[[ -x "$bench" ]] || { echo "interleaved_vs_torch.sh: no loss_bench binary" >&2; exit 1; }
out=target/interleaved
mkdir -p "$out"
stamp=$(date +%Y%m%d-%H%M%S)

for loss in "${losses[@]}"; do
  log="$out/$loss-$batch-$stamp.jsonl"
  for r in $(seq "$rounds"); do
    if [[ -n "$baseline" ]]; then
      RAYON_NUM_THREADS=2 "$baseline" --loss "$loss" --batch "$batch" 2>/dev/null | tail -n 1 \
        | sed 's/"impl":"rankwise"/"impl":"baseline"/' >> "$log"
    fi
    RAYON_NUM_THREADS=2 "$bench" --loss "$loss" --batch "$batch" 2>/dev/null | tail -n 1 >> "$log"
    "$python" benches/losses_vs_torch.py --one "$loss" "$batch" 2>/dev/null | tail -n 1 >> "$log"
  done
  python3 - "$log" "$loss" "$batch" <<'EOF'
import json, statistics, sys
path, loss, batch = sys.argv[1:]
lines = [json.loads(l) for l in open(path) if l.strip()]
ours = [l["seconds"] * 1e3 for l in lines if l["impl"] == "rankwise"]
torch = [l["seconds"] * 1e3 for l in lines if l["impl"] not in ("rankwise", "baseline")]
before = [l["seconds"] * 1e3 for l in lines if l["impl"] == "baseline"]
ratios = [t / o for o, t in zip(ours, torch)]
for i, (o, t) in enumerate(zip(ours, torch), 1):
    b = f"baseline {before[i - 1]:.3f} ms, " if before else ""
    print(f"{loss} B={batch} round {i}: {b}rankwise {o:.3f} ms, PyTorch {t:.3f} ms, {t / o:.2f}x")
print(f"{loss} B={batch}: rankwise median {statistics.median(ours):.3f} ms, PyTorch median "
      f"{statistics.median(torch):.3f} ms; PyTorch / rankwise median {statistics.median(ratios):.2f}x "
      f"(range {min(ratios):.2f}-{max(ratios):.2f}, {len(ratios)} rounds)")
if before:
    was = [t / b for b, t in zip(before, torch)]
    speedup = [b / o for b, o in zip(before, ours)]
    print(f"{loss} B={batch}: baseline median {statistics.median(before):.3f} ms, PyTorch / baseline "
          f"median {statistics.median(was):.2f}x; baseline / rankwise median "
          f"{statistics.median(speedup):.2f}x (range {min(speedup):.2f}-{max(speedup):.2f})")
EOF
done
