#!/usr/bin/env bash
# The whole GPU check of issue 20 in one command, on a GPU machine without a Rust toolchain:
#
#   scripts/gpu_check.sh OUT_DIR [BUDGET_S]
#
# It needs the binaries built by scripts/build_cuda.sh (.gpu/rankwise.xz, .gpu/gpu_check.xz),
# the NVIDIA driver, and a Python 3 with PyTorch (CUDA) for the anchors. Within BUDGET_S seconds
# (default 480) it runs, each step under its own timeout so that one slow step cannot eat the
# others' time (GPU_CHECK_SKIP="recipes torch-eval ..." leaves steps out; the names are in the
# `run` lines below):
#   1. gpu_check: every loss, the metrics engine, the models and optimizers on CUDA vs the CPU,
#      a checkpoint resume on CUDA (OUT_DIR/gpu_check.json, appended to by the later steps; the
#      losses by family of device kernels, each family in a process of its own);
#   2. our benchmarks: small-CNN training throughput, each loss up to the largest batch that
#      fits, SOP-scale evaluation, ResNet-18/50 training throughput (through cuDNN when the
#      binaries have the `cudnn` feature, then ResNet-50 once more without it, `train-candle`;
#      the losses with device kernels once more without them, `losses-host`, and HAPPIER's
#      kernels beyond their default bound, B = 8192 and 16,384, `losses-large`; ResNet-50
#      trained through the image pipeline from a synthetic SOP dataset on disk, `pipeline`);
#   3. the PyTorch anchors on the same GPU (benches/losses_vs_torch.py, train_throughput_vs_torch.py,
#      eval_topk_torch.py) into OUT_DIR/torch_*.jsonl;
#   4. every configs/paper recipe's first steps and one evaluation on a synthetic dataset in the
#      real on-disk format (scripts/recipe_smoke.sh → OUT_DIR/recipe_smoke.jsonl).
# GPU memory is sampled by nvidia-smi every 100 ms; OUT_DIR/gpu_memory.json gives the peak "used"
# memory of the device in the time window of every timed entry (ours and PyTorch's alike).
# OUT_DIR keeps at most 8 small files; stderr of every step goes to OUT_DIR/gpu_check.log.
#
# To test this script without a GPU: GPU_CHECK_DEVICE=cpu GPU_CHECK_EXTRA=--small (gpu_check's
# small sizes) GPU_CHECK_BIN_DIR=target/debug/examples-and-rankwise with a short BUDGET_S; the
# steps then run on the CPU and time out early.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:?usage: scripts/gpu_check.sh OUT_DIR [BUDGET_S]}"
budget="${2:-480}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
log="$out/gpu_check.log"
start=$SECONDS
left() { echo $((budget - (SECONDS - start))); }
step() { echo "[gpu_check.sh] $(date +%T) +$((SECONDS - start))s $*" | tee -a "$log" >&2; }

scratch="${GPU_CHECK_SCRATCH:-/tmp/rankwise_gpu}"
mkdir -p "$scratch/bin"
for b in rankwise gpu_check; do
  if [[ -n "${GPU_CHECK_BIN_DIR:-}" ]]; then  # uncompressed binaries (a test of this script)
    cp "$GPU_CHECK_BIN_DIR/$b" "$scratch/bin/$b"
    continue
  fi
  if [[ ! -f ".gpu/$b.xz" ]]; then
    echo "missing .gpu/$b.xz: run scripts/build_cuda.sh on the build machine first" >&2
    exit 2
  fi
  xz -dc ".gpu/$b.xz" > "$scratch/bin/$b" && chmod +x "$scratch/bin/$b"
done
py="${PYTHON:-python3}"
device="${GPU_CHECK_DEVICE:-cuda}"
read -r -a extra <<< "${GPU_CHECK_EXTRA:-}"
# The CUDA libraries of the machine's PyTorch (cuBLAS, cuRAND, nvrtc, cudart) for our binaries.
nvlibs="$("$py" - <<'EOF' 2>/dev/null
import glob, os
try:
    import nvidia
    roots = list(nvidia.__path__)
except Exception:
    roots = []
dirs = []
for r in roots:
    dirs += sorted(d for d in glob.glob(os.path.join(r, "*", "lib")) if os.path.isdir(d))
    dirs += sorted(d for d in glob.glob(os.path.join(r, "*", "lib64")) if os.path.isdir(d))
print(":".join(dirs))
EOF
)"
export LD_LIBRARY_PATH="${nvlibs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
step "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv > "$out/device.txt" 2>&1 || true
nproc >> "$out/device.txt"
cat .gpu/BUILD_INFO >> "$out/device.txt" 2>/dev/null || echo "binaries: no .gpu/BUILD_INFO" >> "$out/device.txt"
"$py" -c 'import torch; print("torch", torch.__version__, torch.version.cuda, torch.cuda.get_device_name(0))' >> "$out/device.txt" 2>&1
cat "$out/device.txt" >&2
# A binary that cannot start (a library missing from LD_LIBRARY_PATH: cuDNN, cuBLAS…) would fail
# every step in the same way: say which library, once, at the top of the log.
for b in gpu_check rankwise; do
  if ! "$scratch/bin/$b" --help > /dev/null 2>> "$log"; then
    step "$b does not start; its missing libraries:"
    ldd "$scratch/bin/$b" 2>&1 | grep -i "not found" | tee -a "$log" >&2
  fi
done

# Device memory sampler: unix ms and MiB used, every 100 ms.
"$py" -u - "$scratch/memory.csv" <<'EOF' &
import subprocess, sys, time
out = open(sys.argv[1], "w", buffering=1)
p = subprocess.Popen(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits",
                      "-lms", "100"], stdout=subprocess.PIPE, text=True)
for line in p.stdout:
    out.write(f"{int(time.time() * 1000)},{line.strip()}\n")
EOF
sampler=$!
trap 'kill $sampler 2>/dev/null; pkill -f "nvidia-smi --query-gpu=memory.used" 2>/dev/null' EXIT

gc() {  # gpu_check with a hard timeout of $1 seconds (its own budget GC_RESERVE=10 s less)
  local t=$1; shift
  (( $(left) < 10 )) && { step "skipped (budget): gpu_check $*"; return; }
  (( t > $(left) )) && t=$(left)
  step "gpu_check $* (timeout ${t}s)"
  timeout --kill-after=5 "$t" "$scratch/bin/gpu_check" --device "$device" --out "$out" \
    --budget-s $((t - ${GC_RESERVE:-10})) "${extra[@]}" "$@" 2>> "$log"
  step "exit $?"
}
# A kernel that faults leaves its process's CUDA context unusable, so the losses run in several
# processes: a fault then costs its own group's entries only.
loss_groups() {  # $1: seconds for all; then the groups (comma lists of --losses), each in a
  # process of its own with a share of what is left proportional to its number of losses.
  local end=$((SECONDS + $1)); shift
  local n=0 g; for g in "$@"; do n=$((n + $(tr ',' '\n' <<< "$g" | wc -l))); done
  for g in "$@"; do
    local k; k=$(tr ',' '\n' <<< "$g" | wc -l)
    local t=$(( (end - SECONDS) * k / n )); n=$((n - k))
    # The budget is checked between entries and the report written after each: a kill cuts
    # one entry at most, so a small reserve.
    (( t >= 5 )) && GC_RESERVE=2 gc "$t" --only losses --losses "$g"
  done
}
pyb() {  # a PyTorch anchor with a hard timeout of $1 seconds
  local t=$1; shift
  (( $(left) < 10 )) && { step "skipped (budget): $*"; return; }
  (( t > $(left) )) && t=$(left)
  step "$py $* (timeout ${t}s)"
  timeout --kill-after=5 "$t" "$py" "$@" 2>> "$log"
  step "exit $?"
}

skip=" ${GPU_CHECK_SKIP:-} "  # steps to leave out, e.g. GPU_CHECK_SKIP="recipes torch-eval"
run() { [[ "$skip" != *" $1 "* ]]; }
# The comparisons with the CPU in full f32: without TF32, which cuDNN (and cuBLAS where allowed)
# would otherwise use for f32 convolutions on this GPU, as PyTorch does by default.
if run correctness; then
  NVIDIA_TF32_OVERRIDE=0 gc 90 --only threads,metrics,models,resume
  # The loss checks by family of device kernels, each in a process of its own (see loss_groups).
  for family in smooth_rank triplet rambo fastap other; do
    NVIDIA_TF32_OVERRIDE=0 gc 15 --only loss-checks --families "$family"
  done
fi
# Training throughput under PyTorch's defaults (TF32 convolutions), through cuDNN (feature cudnn),
# then ResNet-50 through candle's ops (RANKWISE_CUDNN=0), the path before models::cudnn.
run train && gc 70 --only train
run train-candle && RANKWISE_CUDNN=0 gc 40 --only train --models resnet50
# Training through the image pipeline (a synthetic SOP dataset on disk, the loader putting each
# batch on the device from page-locked buffers, then from pageable memory), and the check that
# the batches on the device are the CPU's.
run pipeline && gc 60 --only pipeline
# Each loss with kernels of its own in a process of its own; the costliest first.
kernel_losses=(happier smooth-ap roadmap triplet-semihard fastap rambo rambo-memory)
run losses && loss_groups 150 "${kernel_losses[@]}" \
  contrastive,nsm,csl,triplet-semihard-plain,fastap-plain,contrastive-plain,op-floor
# The same losses once more with the kernels off (RANKWISE_DEVICE_KERNELS=0: the host pass;
# FastAP's plain tensor formulation), for the side-by-side at B = 256 and 4096.
run losses-host && RANKWISE_DEVICE_KERNELS=0 gc 70 --only losses --losses "$(IFS=,; echo "${kernel_losses[*]}")" --cap 4096
# The kernels whose work is near B³ (HAPPIER's hierarchical positives) beyond their default
# bound (B = 4096): at B = 8192 and 16,384, against the host engine's entries of the first run,
# to set the bound from data. (Smooth-AP, ROADMAP and the triplet minings visit only the pairs
# with a positive, `B² m` work for m per class, and RaMBO sorts, `B² log² B`: within the bound
# at B = 16,384 already.)
run losses-large && RANKWISE_KERNEL_MAX_WORK=2^42 gc 60 --only losses \
  --losses happier --start-batch 8192 --cap 16384
run eval && gc 60 --only eval
run torch-losses && pyb 50 benches/losses_vs_torch.py --device "$device" --max-batch --budget-s 6 --out "$out/torch_losses.jsonl"
run torch-train && pyb 45 benches/train_throughput_vs_torch.py --device "$device" --config small:32:64 --config resnet50:224:256 --config resnet18:224:256 --time-s 2 --out "$out/torch_train.jsonl"
run torch-eval && pyb 30 benches/eval_topk_torch.py --device "$device" --out "$out/torch_eval.jsonl"
if run recipes && (( $(left) > 30 )); then
  step "recipe smoke (budget $(( $(left) - 15 ))s)"
  # One recipe of each paper and dataset format first: under the budget, the first ones run.
  order="rambo_cub smooth_ap_sop fastap_inshop happier_dyml_vehicle happier_inat_base"
  order+=" smooth_ap_vehicleid happier_dyml_product smooth_ap_inat rambo_inshop fastap_sop"
  order+=" happier_sop rambo_sop happier_dyml_animal happier_inat_full"
  RECIPE_SMOKE_RECIPES="$order" \
  RECIPE_SMOKE_TIMEOUT=45 RECIPE_SMOKE_BUDGET=$(( $(left) - 15 )) RECIPE_SMOKE_SCRATCH="$scratch/recipes" \
    scripts/recipe_smoke.sh "$scratch/bin/rankwise" "$scratch/data" "$out" "$device" 2>> "$log"
  step "exit $?"
fi

kill $sampler 2>/dev/null
# Peak device memory in each timed entry's window.
"$py" - "$out" "$scratch/memory.csv" <<'EOF' || true
import json, os, sys
out, mem = sys.argv[1], sys.argv[2]
samples = []
for line in open(mem):
    try:
        t, m = line.strip().split(",")
        samples.append((int(t), float(m)))
    except ValueError:
        pass
def peak(t0, t1):
    v = [m for t, m in samples if t0 <= t <= t1]
    return max(v) if v else None
windows = []
try:
    doc = json.load(open(os.path.join(out, "gpu_check.json")))
    for e in doc.get("benchmarks", []) + doc.get("checks", []):
        if "unix_start_ms" in e and "unix_end_ms" in e:
            windows.append({"source": "rankwise", **{k: e.get(k) for k in ("kind", "loss", "model", "name", "B", "batch")},
                            "peak_used_mib": peak(e["unix_start_ms"], e["unix_end_ms"])})
except FileNotFoundError:
    pass
for name in ("torch_losses.jsonl", "torch_train.jsonl", "torch_eval.jsonl"):
    p = os.path.join(out, name)
    if not os.path.exists(p):
        continue
    # A row's window runs from the previous row's end (or the file's first row minus 60 s).
    prev = None
    for line in open(p):
        try:
            e = json.loads(line)
        except ValueError:
            continue
        end = e.get("unix_end_ms")
        if end is None:
            continue
        t0 = prev if prev is not None else end - 60_000
        windows.append({"source": name, **{k: e.get(k) for k in ("loss", "model", "batch", "B", "phase", "status")},
                        "torch_peak_mib": e.get("peak_mib"), "peak_used_mib": peak(t0, end)})
        prev = end
json.dump({"samples": len(samples), "idle_mib": min((m for _, m in samples), default=None),
           "max_mib": max((m for _, m in samples), default=None), "windows": windows},
          open(os.path.join(out, "gpu_memory.json"), "w"), indent=1)
EOF
step "done in $((SECONDS - start)) s"
ls -la "$out" >&2
