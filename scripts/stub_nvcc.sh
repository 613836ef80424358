#!/usr/bin/env bash
# A stand-in for nvcc used by `scripts/build_cuda.sh --check` only: enough for the build scripts
# of cudarc (`nvcc --version`) and candle-kernels (PTX files, objects and a static library through
# cudaforge), writing empty outputs. `cargo check` never links a binary nor loads a kernel, so
# the check type-checks our code and candle's against the CUDA API without compiling candle's
# kernels (20 min on a 2-core machine). Never use it for a build.
out="" outdir="" lib=0 ptx=0 prev="" inputs=()
for a in "$@"; do
  case "$prev" in
    -o) out="$a" ;;
    --output-directory) outdir="$a" ;;
  esac
  case "$a" in
    --version)
      # The layout of the real output: cudarc reads the 4th line.
      printf '%s\n' "nvcc: NVIDIA (R) Cuda compiler driver (stub for cargo check)" \
        "Copyright (c) 2005-2025 NVIDIA Corporation" "Built on a stub" \
        "Cuda compilation tools, release 13.0, V13.0.88" "Build cuda_13.0.stub"
      exit 0
      ;;
    --list-gpu-code)
      echo "sm_90"
      exit 0
      ;;
    --lib) lib=1 ;;
    --ptx) ptx=1 ;;
    *.cu) inputs+=("$a") ;;
  esac
  prev="$a"
done
if ((ptx)); then
  for f in "${inputs[@]}"; do
    : > "${outdir:-.}/$(basename "${f%.cu}").ptx"
  done
elif ((lib)); then
  rm -f "$out"
  ar rcs "$out"
elif [[ -n "$out" ]]; then
  printf '' | cc -x c -c - -o "$out"
fi
