#!/usr/bin/env bash
# More seeds for the `standard` tables on a machine with many cores and no Rust toolchain — the
# device machine of the CUDA issue (16 cores) — merged back into the run cache here.
#
#   scripts/device_standard.sh pack
#       here, after `cargo build --release`: the stripped binary, xz-compressed, into
#       .gpu/rankwise-cpu.xz (git-ignored; name `.gpu` in the device call's `carry`), its
#       run code into .gpu/RUN_CODE_CPU, and the pretrained backbones of the standard cache
#       (target/rankwise-runs/standard/backbones/, with their runs' entries) into
#       .gpu/standard-backbones/: the runs there start from these very weights (a run's key
#       holds its weights' bytes, and another CPU may round the pretraining differently).
#   scripts/device_standard.sh run OUT_DIR BUDGET_S FIRST_SEED SEEDS PAPER...
#       there: seeds FIRST_SEED … FIRST_SEED + SEEDS − 1 of every row of each PAPER's standard
#       recipe (smooth_ap, fastap, rambo, happier: the papers whose runs are cached; SSR's are
#       not), every run on the CPU, as many side by side as there are cores (one thread each).
#       Runs start seed by seed, so a budget that runs out leaves whole seeds. Writes
#       OUT_DIR/runs-<paper>.tar.xz (the new run-cache entries) and OUT_DIR/device_standard.log.
#   scripts/device_standard.sh merge FILE...
#       here: unpacks the entries into target/rankwise-runs/standard/ and says, per run code,
#       which seeds came back. Entries whose run code differs from this build's are never read
#       (the cache is keyed by it). Then raise `[seeds] standard` of the recipe to cover the
#       seeds and `rankwise reproduce --scale standard PAPER` reads them from the cache.
#
# Why it works: a run's cache key is its resolved recipe (the seed included) and the run code,
# not the seed list it was part of, so seed 20 trained there as the first of a list starting at 20
# is the same entry as seed 20 of a 24-seed list here. The values do not depend on the machine:
# each run has one thread here (2 cores, 2 side by side) and there.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
die() { echo "device_standard.sh: $*" >&2; exit 2; }
# run_code_of, seeds_per_code
source scripts/standard_lib.sh

cmd="${1:-}"
[[ -n "$cmd" ]] || { sed -n '2,26p' "$0"; exit 2; }
shift
case "$cmd" in
  pack)
    bin="${CARGO_TARGET_DIR:-target}/release/rankwise"
    [[ -x "$bin" ]] || die "no $bin: cargo build --release --locked first"
    mkdir -p .gpu
    strip -o .gpu/rankwise-cpu "$bin"
    xz -T0 -6 -f .gpu/rankwise-cpu
    run_code_of "$bin" > .gpu/RUN_CODE_CPU
    rm -rf .gpu/standard-backbones
    cache="$standard_cache"
    if compgen -G "$cache/backbones/*.safetensors" > /dev/null; then
      mkdir -p .gpu/standard-backbones/backbones
      for w in "$cache"/backbones/*.safetensors; do
        stem=$(basename "$w" .safetensors)
        cp "$w" .gpu/standard-backbones/backbones/
        [[ -f "$cache/$stem.json" ]] && cp "$cache/$stem.json" .gpu/standard-backbones/
      done
      echo "packed $(ls .gpu/standard-backbones/backbones | wc -l) pretrained backbone(s)"
    fi
    echo "packed .gpu/rankwise-cpu.xz ($(du -h .gpu/rankwise-cpu.xz | cut -f1)), run code $(cat .gpu/RUN_CODE_CPU)"
    ;;
  run)
    [[ $# -ge 5 ]] || die "usage: run OUT_DIR BUDGET_S FIRST_SEED SEEDS PAPER..."
    out="$1" budget="$2" first="$3" count="$4"
    shift 4
    [[ "$budget" =~ ^[0-9]+$ && "$first" =~ ^[0-9]+$ && "$count" =~ ^[1-9][0-9]*$ ]] ||
      die "BUDGET_S, FIRST_SEED and SEEDS must be integers (SEEDS ≥ 1), got '$budget' '$first' '$count'"
    for p in "$@"; do
      case "$p" in smooth_ap|fastap|rambo|happier) ;; *) die "paper '$p': one of smooth_ap fastap rambo happier" ;; esac
    done
    mkdir -p "$out"
    out="$(cd "$out" && pwd)"
    log="$out/device_standard.log"
    start=$SECONDS
    scratch="${DEVICE_STANDARD_SCRATCH:-/tmp/rankwise_standard}"
    rm -rf "$scratch"
    mkdir -p "$scratch/root/configs" "$scratch/root/paper_tables"
    bin="${DEVICE_STANDARD_BIN:-}"
    if [[ -z "$bin" ]]; then
      [[ -f .gpu/rankwise-cpu.xz ]] || die "missing .gpu/rankwise-cpu.xz: run '$0 pack' on the build machine first"
      xz -dc .gpu/rankwise-cpu.xz > "$scratch/rankwise" && chmod +x "$scratch/rankwise"
      bin="$scratch/rankwise"
    fi
    cores=$(nproc)
    { echo "$(date -u +%FT%TZ) $("$bin" --version), $cores cores, seeds $first..$((first + count - 1)), papers $*, budget ${budget}s"
      grep -m1 "model name" /proc/cpuinfo || true; } | tee -a "$log"
    # A copy of the recipes whose standard seed list is the requested one.
    cp -r configs/experiments "$scratch/root/configs/"
    cp -r paper_tables/published "$scratch/root/paper_tables/"
    for p in "$@"; do
      python3 - "$scratch/root/configs/experiments/$p.toml" "$first" "$count" <<'EOF'
import re, sys
path, first, count = sys.argv[1], sys.argv[2], sys.argv[3]
text = open(path).read()
def set_key(section, key, value, text):
    pattern = re.compile(r"(^\[%s\]\n(?:(?!^\[).*\n)*?)^%s = .*$" % (re.escape(section), key), re.M)
    new, n = pattern.subn(lambda m: m.group(1) + "%s = %s" % (key, value), text)
    if n != 1:
        sys.exit("%s: no `%s = …` in [%s]" % (path, key, section))
    return new
text = set_key("seeds", "standard", count, text)
text = set_key("standard", "seed", first, text)
# The earlier looks of the committed tables need not be below this run's count, and this run's
# tables are scratch: drop them.
text = re.sub(r"^\[seeds\.looks\]\n(?:(?!^\[).*\n)*", "", text, flags=re.M)
open(path, "w").write(text)
EOF
    done
    status=0
    for p in "$@"; do
      left=$((budget - (SECONDS - start) - 20))
      if (( left < 30 )); then echo "out of budget before $p" | tee -a "$log"; break; fi
      echo "$(date -u +%T) +$((SECONDS - start))s $p (at most ${left}s)" | tee -a "$log"
      mkdir -p "$scratch/runs-$p"
      # The backbones pretrained on the build machine (see pack), so that these runs' keys are
      # those of the runs there.
      [[ -d .gpu/standard-backbones ]] && cp -r .gpu/standard-backbones/. "$scratch/runs-$p/"
      rc=0
      RANKWISE_JOBS=$cores RAYON_NUM_THREADS=$cores timeout "$left" "$bin" reproduce --scale standard \
        --root "$scratch/root" --runs-dir "$scratch/runs-$p" --tables-dir "$scratch/tables" \
        --figures-dir "$scratch/figures" "$p" >> "$log" 2>&1 || rc=$?
      n=$(find "$scratch/runs-$p" -name '*.json' | wc -l)
      echo "$(date -u +%T) +$((SECONDS - start))s $p: exit $rc, $n runs" | tee -a "$log"
      (( rc == 0 )) || status=$rc
      # Only the cache entries: a run's file is written atomically, so every one is whole.
      (( n == 0 )) || tar -C "$scratch/runs-$p" -cf - --exclude='*.tmp' . | xz -T0 -6 > "$out/runs-$p.tar.xz"
    done
    exit $status
    ;;
  merge)
    [[ $# -ge 1 ]] || die "usage: merge FILE..."
    dest="$root/$standard_cache"
    mkdir -p "$dest"
    for f in "$@"; do
      [[ -f "$f" ]] || die "no such file: $f"
      tar -xJf "$f" -C "$dest" --wildcards '*.json'
      echo "$f:"
      tar -tJf "$f" --wildcards '*.json' | seeds_per_code "$dest" "  "
    done
    echo "this build's run code: $(run_code_of)"
    ;;
  *) die "unknown command '$cmd' (pack, run or merge)" ;;
esac
