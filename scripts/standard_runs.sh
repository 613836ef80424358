#!/usr/bin/env bash
# The `standard` run cache carried in the repository: the raw runs behind the standard tables,
# committed as xz packs under paper_tables/standard/runs/.
#
#   scripts/standard_runs.sh save
#       packs the entries of target/rankwise-runs/standard/ that were made by this build's run
#       code (`rankwise --version`) and that no committed pack holds yet — each run's JSON
#       (recipe, final metrics, every evaluation of its curve, seconds, seed, device) and the
#       pretrained backbones with their pretraining's entry — into
#       paper_tables/standard/runs/<run code>-<UTC time>.tar.xz. Packs are only ever added, so
#       the history holds each run once.
#   scripts/standard_runs.sh load
#       unpacks every committed pack into target/rankwise-runs/standard/ (an entry already there
#       is kept) and lists, per run code, how many runs and which seeds came back. Then
#       `rankwise reproduce --scale standard PAPER` reads those runs instead of training them
#       (a run's cache key is its resolved recipe, the pretrained weights' bytes and the run
#       code) and trains only what is missing.
#
# Why: one paper's standard regeneration (Smooth-AP 160 runs, HAPPIER 200, about 130 s each on
# one core) takes longer than a working session on a 2-core machine, and the cache under target/
# does not outlive the machine. A session that runs out of time saves what it trained; the next
# loads it and goes on. The packs are also the evidence the standard tables rest on: anyone can
# re-read every table, figure and verdict from them without training (load, then reproduce).
#
# RANKWISE_STANDARD_CACHE and RANKWISE_STANDARD_PACKS override the two folders, and
# RANKWISE_STANDARD_RUN_CODE the run code (default: the release binary's), for tests.
set -euo pipefail
cd "$(dirname "$0")/.."
die() { echo "standard_runs.sh: $*" >&2; exit 2; }
# run_code_of, seeds_per_code
source scripts/standard_lib.sh

cache="${RANKWISE_STANDARD_CACHE:-$standard_cache}"
packs="${RANKWISE_STANDARD_PACKS:-paper_tables/standard/runs}"

# The names every committed pack holds, one per line.
packed() {
  shopt -s nullglob
  local f
  for f in "$packs"/*.tar.xz; do
    tar -tJf "$f" || die "cannot read $f"
  done
}

case "${1:-}" in
  save)
    code="${RANKWISE_STANDARD_RUN_CODE:-$(run_code_of)}"
    [[ -n "$code" ]] || die "no run code: cargo build --release --locked first"
    [[ "$code" =~ ^[0-9a-f]{16}$ ]] || die "not a run code: '$code'"
    [[ -d "$cache" ]] || die "no run cache at $cache"
    mkdir -p "$packs"
    list=$(mktemp)
    trap 'rm -f "$list" "$list.old"' EXIT
    # This code's entries (a run's JSON names the code that made it), less those already
    # packed; a backbone goes with its pretraining's entry (same key).
    packed | sort -u > "$list.old"
    python3 - "$cache" "$code" "$list.old" > "$list" <<'EOF'
import json, os, sys
cache, code, old = sys.argv[1], sys.argv[2], set(open(sys.argv[3]).read().split())
for name in sorted(os.listdir(cache)):
    if not name.endswith(".json"):
        continue
    try:
        run = json.load(open(os.path.join(cache, name)))
    except (OSError, ValueError) as e:
        sys.exit("%s: %s" % (os.path.join(cache, name), e))
    if run.get("code") != code:
        continue
    weights = "backbones/%s.safetensors" % name[: -len(".json")]
    for entry in [name] + ([weights] if os.path.isfile(os.path.join(cache, weights)) else []):
        if entry not in old:
            print(entry)
EOF
    n=$(grep -c '\.json$' "$list" || true)
    if (( n == 0 )); then
      echo "nothing new to save: every entry of run code $code in $cache is in $packs/"
      exit 0
    fi
    out="$packs/$code-$(date -u +%Y%m%dT%H%M%SZ).tar.xz"
    tar -C "$cache" -cf - -T "$list" | xz -9 -T1 > "$out.tmp"
    mv "$out.tmp" "$out"
    echo "saved $n entries of run code $code ($(grep -c '\.safetensors$' "$list" || true) backbone(s)) to $out ($(du -h "$out" | cut -f1))"
    ;;
  load)
    mkdir -p "$cache"
    shopt -s nullglob
    files=("$packs"/*.tar.xz)
    (( ${#files[@]} > 0 )) || { echo "no packs under $packs/"; exit 0; }
    for f in "${files[@]}"; do
      tar -xJf "$f" -C "$cache" --skip-old-files || die "cannot unpack $f"
    done
    packed | grep '\.json$' | sort -u | seeds_per_code "$cache"
    echo "into $cache; this build's run code: $(run_code_of)"
    ;;
  *) sed -n '2,30p' "$0"; exit 2 ;;
esac
