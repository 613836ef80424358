#!/usr/bin/env bash
# Smoke run of every paper recipe (configs/paper/*.toml) on synthetic data in its dataset's
# on-disk format: for each recipe, `BIN synth-data` writes a dataset sized for the recipe's
# sampler (JPEGs, list files, real folder names), then `BIN train` runs one epoch on it (a few
# batches at the recipe's real batch size, through the real image pipeline and prefetching) and
# one evaluation with the dataset's test protocol, from random initialisation (the recipes'
# ImageNet weights are not needed).
#
#   scripts/recipe_smoke.sh BIN DATA_DIR OUT_DIR [DEVICE]
#
#   BIN       the rankwise binary (e.g. target/release/rankwise; built with --features cuda for
#             DEVICE=cuda)
#   DATA_DIR  where the synthetic datasets go, one folder per recipe (DATA_DIR/<recipe>;
#             an earlier synthetic dataset there is replaced, anything else is refused)
#   OUT_DIR   receives recipe_smoke.jsonl only: one JSON object per recipe with
#             recipe, status (pass / fail / skipped), seconds (wall, dataset + training),
#             timed_out, train_images, batches (the synth-data check line), metrics (the
#             trainer's R@1 line), r_at_1, steps, and error (the tail of the log) on failure
#   DEVICE    cpu, cuda or auto (default cuda)
#
# Environment:
#   RECIPE_SMOKE_SCRATCH     run folders and logs (default /tmp/recipe_smoke): kept out of
#                            OUT_DIR so that checkpoints do not travel back with the results
#   RECIPE_SMOKE_TIMEOUT     seconds per recipe, dataset and training together (default 60)
#   RECIPE_SMOKE_BUDGET      seconds for the whole run (default: none); once spent, the remaining
#                            recipes are recorded as "skipped", and a recipe never gets more than
#                            what is left of it
#   RECIPE_SMOKE_RECIPES     space-separated recipe names to run, in this order (default: all,
#                            alphabetically)
#   RECIPE_SMOKE_EXTRA_SETS  extra arguments for both synth-data and train, e.g. a cheap CPU run:
#                            "--set model.backbone.kind=small_cnn --set sampler.batch_size=16"
#                            (the dataset is sized for the sampler after these overrides)
#   RECIPE_SMOKE_IMAGE_SIZE  height of the synthetic images in pixels (default 64)
#   RECIPE_SMOKE_KEEP_PRETRAINED=1  keep the recipes' `pretrained` weights (default: removed
#                            with `--set pretrained=`, training from random initialisation)
#
# Exit status: 0 when no recipe failed (skipped ones do not count), 1 otherwise, 2 on bad usage.
set -euo pipefail

usage() { sed -n '2,36p' "$0" >&2; exit 2; }
[[ $# -ge 3 && $# -le 4 ]] || usage
bin=$1
data_dir=$2
out_dir=$3
device=${4:-cuda}
[[ -x "$bin" ]] || { echo "recipe_smoke.sh: BIN '$bin' is not an executable file" >&2; exit 2; }
case "$device" in cpu | cuda | auto) ;; *) echo "recipe_smoke.sh: DEVICE must be cpu, cuda or auto, got '$device'" >&2; exit 2 ;; esac

repo=$(cd "$(dirname "$0")/.." && pwd)
scratch=${RECIPE_SMOKE_SCRATCH:-/tmp/recipe_smoke}
per_recipe=${RECIPE_SMOKE_TIMEOUT:-60}
budget=${RECIPE_SMOKE_BUDGET:-}
image_size=${RECIPE_SMOKE_IMAGE_SIZE:-64}
for v in per_recipe image_size; do
  [[ ${!v} =~ ^[0-9]+$ && ${!v} -gt 0 ]] || { echo "recipe_smoke.sh: $v must be a positive integer, got '${!v}'" >&2; exit 2; }
done
[[ -z "$budget" || $budget =~ ^[0-9]+$ ]] || { echo "recipe_smoke.sh: RECIPE_SMOKE_BUDGET must be a number of seconds, got '$budget'" >&2; exit 2; }
read -r -a extra <<< "${RECIPE_SMOKE_EXTRA_SETS:-}"
read -r -a only <<< "${RECIPE_SMOKE_RECIPES:-}"
no_weights=(--set pretrained=)
[[ "${RECIPE_SMOKE_KEEP_PRETRAINED:-0}" == 1 ]] && no_weights=()

mkdir -p "$data_dir" "$out_dir" "$scratch/runs" "$scratch/logs"
bin=$(cd "$(dirname "$bin")" && pwd)/$(basename "$bin")
jsonl="$out_dir/recipe_smoke.jsonl"
: > "$jsonl"

# Microseconds since the epoch (bash 5's EPOCHREALTIME, else date).
now_us() {
  if [[ -n "${EPOCHREALTIME:-}" ]]; then echo "${EPOCHREALTIME/[.,]/}"; else date +%s%6N; fi
}
seconds_since() { # start_us → "12.345"
  local d=$(( $(now_us) - $1 ))
  printf '%d.%03d' $((d / 1000000)) $(((d % 1000000) / 1000))
}

# A JSON string literal of $1: backslash, quote and control characters escaped, other control
# bytes (e.g. terminal escapes) dropped.
json_str() {
  local s=$1
  s=${s//\\/\\\\}
  s=${s//\"/\\\"}
  s=${s//$'\n'/\\n}
  s=${s//$'\r'/}
  s=${s//$'\t'/\\t}
  s=$(printf '%s' "$s" | tr -d '\000-\010\013-\037')
  printf '"%s"' "$s"
}

# The last lines of a log, at most 1,500 characters.
tail_of() {
  local t
  t=$(tail -n 8 "$1" 2>/dev/null || true)
  [[ -n "$t" ]] || t="(no output)"
  if (( ${#t} > 1500 )); then t="…${t: -1500}"; fi
  printf '%s' "$t"
}

# A number or null from results.json's pretty-printed `"key": value` line.
json_number() { # key file
  local v
  v=$(grep -m1 -E "^  \"$1\": " "$2" 2>/dev/null | sed -E 's/^[^:]*: *//; s/,$//') || true
  [[ $v =~ ^-?[0-9.eE+-]+$ ]] && printf '%s' "$v" || printf 'null'
}

started=$(now_us)
failed=0
shopt -s nullglob
# RECIPE_SMOKE_RECIPES also gives the order (under a budget, the first ones are the ones run).
if [[ ${#only[@]} -gt 0 ]]; then
  recipes=()
  for name in "${only[@]}"; do
    [[ -f "$repo/configs/paper/$name.toml" ]] || { echo "recipe_smoke.sh: no recipe configs/paper/$name.toml" >&2; exit 2; }
    recipes+=("$repo/configs/paper/$name.toml")
  done
else
  recipes=("$repo"/configs/paper/*.toml)
fi
[[ ${#recipes[@]} -gt 0 ]] || { echo "recipe_smoke.sh: no recipe in $repo/configs/paper" >&2; exit 2; }
for config in "${recipes[@]}"; do
  name=$(basename "$config" .toml)
  limit=$per_recipe
  if [[ -n "$budget" ]]; then
    left=$(( budget - ($(now_us) - started) / 1000000 ))
    if (( left < 5 )); then
      printf '{"recipe":%s,"status":"skipped","seconds":0,"reason":%s}\n' "$(json_str "$name")" \
        "$(json_str "the budget of $budget s was spent")" >> "$jsonl"
      echo "[recipe_smoke] $name: skipped (budget of $budget s spent)" >&2
      continue
    fi
    (( left < limit )) && limit=$left
  fi
  t0=$(now_us)
  root="$data_dir/$name"
  run="$scratch/runs/$name"
  synth_log="$scratch/logs/$name.synth.log"
  train_log="$scratch/logs/$name.train.log"
  rm -rf "$run"
  status=pass timed_out=false error="" metrics="" batches="" train_images=null

  set +e
  timeout --kill-after=10 "$limit" "$bin" synth-data --config "$config" ${extra[@]+"${extra[@]}"} \
    --root "$root" --force --image-size "$image_size" > "$synth_log" 2>&1
  rc=$?
  set -e
  if (( rc != 0 )); then
    status=fail
    (( rc == 124 || rc == 137 )) && timed_out=true
    error="synth-data exited with $rc: $(tail_of "$synth_log")"
  else
    batches=$(grep -m1 'epoch 0 has' "$synth_log" | sed -E 's/^[^:]*: //' || true)
    train_images=$(grep -m1 -oE '[0-9]+ training images' "$synth_log" | grep -oE '^[0-9]+' || echo null)
    remaining=$(( limit - ($(now_us) - t0) / 1000000 ))
    (( remaining < 1 )) && remaining=1
    set +e
    timeout --kill-after=10 "$remaining" "$bin" train --config "$config" \
      --set dataset.root="$root" --set epochs=1 --set eval.at_start=false \
      ${no_weights[@]+"${no_weights[@]}"} ${extra[@]+"${extra[@]}"} \
      --out "$run" --device "$device" -q > "$train_log" 2>&1
    rc=$?
    set -e
    if (( rc != 0 )); then
      status=fail
      (( rc == 124 || rc == 137 )) && timed_out=true
      error="train exited with $rc"
      if [[ $timed_out == true ]]; then
        # -q leaves no log to say where it stopped; the run folder's files tell the phase.
        if [[ -f "$run/checkpoint.safetensors" ]]; then phase="after training and evaluating, writing its files"
        elif [[ -f "$run/config.toml" ]]; then phase="while training or evaluating (the data and model were ready)"
        else phase="before training started (loading the data, building the model)"; fi
        error+=" (timed out after $limit s, $phase)"
      fi
      error+=": $(tail_of "$train_log")"
    else
      metrics=$(grep -m1 '^R@1' "$train_log" || true)
      final_epoch=$(json_number final_epoch "$run/results.json")
      r1=$(json_number r_at_1_final "$run/results.json")
      if [[ "$final_epoch" != 1 || "$r1" == null ]]; then
        status=fail
        error="no evaluation after epoch 1 in $run/results.json (final_epoch $final_epoch, R@1 $r1)"
      fi
    fi
  fi
  seconds=$(seconds_since "$t0")
  r1=null steps=null
  if [[ -f "$run/results.json" ]]; then
    r1=$(json_number r_at_1_final "$run/results.json")
    steps=$(json_number steps "$run/results.json")
  fi
  line=$(printf '{"recipe":%s,"status":"%s","seconds":%s,"timed_out":%s,"device":%s,"train_images":%s,"batches":%s,"metrics":%s,"r_at_1":%s,"steps":%s' \
    "$(json_str "$name")" "$status" "$seconds" "$timed_out" "$(json_str "$device")" "$train_images" \
    "$(json_str "$batches")" "$(json_str "$metrics")" "$r1" "$steps")
  if [[ $status == fail ]]; then
    failed=$((failed + 1))
    line+=",\"error\":$(json_str "$error")"
  fi
  echo "$line}" >> "$jsonl"
  echo "[recipe_smoke] $name: $status in $seconds s${metrics:+ — $metrics}" >&2
done
echo "[recipe_smoke] $failed failed; $(seconds_since "$started") s in all; results in $jsonl" >&2
(( failed == 0 ))
