#!/usr/bin/env bash
# Round trip of scripts/standard_runs.sh on a scratch cache (no build, no training): `save`
# packs this run code's entries and backbones, never an entry of another code nor one already
# packed; `load` restores the very bytes and keeps an entry already there.
set -euo pipefail
cd "$(dirname "$0")/.."
t=$(mktemp -d)
trap 'rm -rf "$t"' EXIT
export RANKWISE_STANDARD_CACHE="$t/cache" RANKWISE_STANDARD_PACKS="$t/packs"
export RANKWISE_STANDARD_RUN_CODE=00000000000000aa
fail() { echo "test_standard_runs.sh: $*" >&2; exit 1; }
mkdir -p "$t/cache/backbones"
echo '{"code": "00000000000000aa", "seed": 0}' > "$t/cache/1111111111111111.json"
echo 'weights' > "$t/cache/backbones/1111111111111111.safetensors"
echo '{"code": "00000000000000bb", "seed": 0}' > "$t/cache/2222222222222222.json"
scripts/standard_runs.sh save > "$t/out"
first=("$t"/packs/*.tar.xz)
[[ ${#first[@]} == 1 ]] || fail "one pack expected, got ${first[*]}"
[[ "$(tar -tJf "${first[0]}" | sort | tr '\n' ' ')" == "1111111111111111.json backbones/1111111111111111.safetensors " ]] ||
  fail "first pack holds: $(tar -tJf "${first[0]}")"
scripts/standard_runs.sh save | grep -q "nothing new" || fail "a second save packed again"
sleep 1  # the next pack's name has another second
echo '{"code": "00000000000000aa", "seed": 1}' > "$t/cache/3333333333333333.json"
scripts/standard_runs.sh save > /dev/null
packs=("$t"/packs/*.tar.xz)
[[ ${#packs[@]} == 2 ]] || fail "two packs expected, got ${packs[*]}"
[[ "$(tar -tJf "${packs[1]}")" == "3333333333333333.json" ]] || fail "second pack holds: $(tar -tJf "${packs[1]}")"
# Load into a fresh cache: the same bytes, and a listing by run code.
export RANKWISE_STANDARD_CACHE="$t/fresh"
mkdir -p "$t/fresh"
echo '{"code": "00000000000000aa", "seed": 1, "kept": true}' > "$t/fresh/3333333333333333.json"
scripts/standard_runs.sh load > "$t/listing"
grep -q "run code 00000000000000aa: 2 runs, seeds \[0, 1\]" "$t/listing" || fail "listing: $(cat "$t/listing")"
cmp "$t/cache/1111111111111111.json" "$t/fresh/1111111111111111.json"
cmp "$t/cache/backbones/1111111111111111.safetensors" "$t/fresh/backbones/1111111111111111.safetensors"
grep -q kept "$t/fresh/3333333333333333.json" || fail "load overwrote an entry already there"
[[ ! -e "$t/fresh/2222222222222222.json" ]] || fail "another run code's entry was packed"
echo "standard_runs.sh: save and load round trip ok"
