#!/usr/bin/env bash
# Build rankwise with the `cuda` feature on a machine without a GPU (or with one).
#
#   scripts/build_cuda.sh            release build of the `rankwise` binary and the `gpu_check`
#                                    example (features cuda + cudnn), stripped, then
#                                    xz-compressed into .gpu/ (git-ignored) so that they can
#                                    travel to a GPU machine without a toolchain
#   scripts/build_cuda.sh --check    `cargo check --features cuda,cudnn` of the library, binaries,
#                                    examples and tests, what CI runs so that the GPU path cannot
#                                    rot: with scripts/stub_nvcc.sh as nvcc (empty kernels), it
#                                    type-checks our code against candle's CUDA API in minutes and
#                                    needs no toolkit; candle's kernels, fixed by Cargo.lock, took
#                                    20 of the 20.5 min of the real check on a 2-core machine
#   scripts/build_cuda.sh --check-full  the same check with the real toolkit (kernels compiled)
#
# The toolkit: if `nvcc` is already on PATH (a user's own CUDA install, CUDA_ROOT set), it is used
# as is. Otherwise CUDA 13.0 is installed from PyPI into .cuda/venv (about 1.2 GB, once). The wheels
# are pinned to 13.0.*: unpinned, pip mixes nvvm/crt 13.5 whose PTX 9.5 the 13.0 ptxas rejects.
#
# Linking: candle 0.11 asks cudarc for dynamic linking, so a binary links against libcuda, nvrtc,
# curand, cublas, cublasLt and cudart. The wheels ship only versioned .so files, so .cuda/lib gets
# unversioned links; libcuda is the driver's own library and has no wheel, so a stub with every
# `cu*` entry point of cuda.h (soname libcuda.so.1) is generated for the link only. On the GPU
# machine the real driver's libcuda.so.1 is loaded instead.
#
# cuDNN (feature `cudnn`, models::cudnn: the convolutions and batch normalisation of training): the
# binaries link libcudnn.so.9, taken from the toolkit's lib folders, then from the PyPI wheel
# nvidia-cudnn-cu13 (installed into .cuda/venv), then from the system's linker cache. On the GPU
# machine any cuDNN 9 is loaded (PyTorch's own, through LD_LIBRARY_PATH). RANKWISE_CUDA_FEATURES=cuda
# builds without it.
#
# Environment: CUDA_COMPUTE_CAP (default 90, H100/H200), CARGO_TARGET_DIR (default target/cuda,
# kept apart from the CPU build so neither rebuilds the other), RANKWISE_CUDA_FEATURES (default
# cuda,cudnn).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

mode=build
for arg in "$@"; do
  case "$arg" in
    --check) mode=stub-check ;;
    --check-full) mode=check ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 0 ;;
    *) echo "scripts/build_cuda.sh: unknown argument '$arg' (see --help)" >&2; exit 2 ;;
  esac
done

export CUDA_COMPUTE_CAP="${CUDA_COMPUTE_CAP:-90}"
features="${RANKWISE_CUDA_FEATURES:-cuda,cudnn}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$root/target/cuda}"

if [[ "$mode" == stub-check ]]; then
  stub="$root/.cuda/stub-nvcc"
  mkdir -p "$stub/bin" "$stub/include" "$stub/lib64"
  ln -sf "$root/scripts/stub_nvcc.sh" "$stub/bin/nvcc"
  export NVCC="$stub/bin/nvcc" CUDA_ROOT="$stub" CUDA_PATH="$stub" CUDA_HOME="$stub"
  export PATH="$stub/bin:$PATH"
  # Empty kernels must never mix with real ones: a target folder of their own.
  export CARGO_TARGET_DIR="$root/target/cuda-stub-check"
  start=$SECONDS
  cargo check --locked --features "$features" --lib --bins --examples --tests
  echo "[build_cuda] cargo check --features $features (stub nvcc) passed in $((SECONDS - start)) s" >&2
  exit 0
fi

if command -v nvcc >/dev/null 2>&1 && [[ -n "${CUDA_ROOT:-}${CUDA_PATH:-}" ]]; then
  cuda_root="${CUDA_ROOT:-$CUDA_PATH}"
  echo "[build_cuda] using the CUDA toolkit at $cuda_root ($(command -v nvcc))" >&2
else
  venv="$root/.cuda/venv"
  if [[ ! -x "$venv/bin/python" ]]; then
    echo "[build_cuda] installing CUDA 13.0 (nvcc, runtime, cuBLAS, nvrtc, cuRAND) from PyPI into $venv" >&2
    python3 -m venv "$venv"
  fi
  "$venv/bin/pip" install --quiet --disable-pip-version-check \
    "nvidia-cuda-nvcc==13.0.*" "nvidia-cuda-runtime==13.0.*" "nvidia-cuda-cccl==13.0.*" \
    "nvidia-nvvm==13.0.*" "nvidia-cuda-crt==13.0.*" "nvidia-cublas==13.0.*" \
    "nvidia-cuda-nvrtc==13.0.*" "nvidia-curand"
  if [[ "$features" == *cudnn* ]]; then
    "$venv/bin/pip" install --quiet --disable-pip-version-check "nvidia-cudnn-cu13==9.*"
  fi
  cuda_root="$("$venv/bin/python" -c 'import nvidia, os; print(os.path.join(list(nvidia.__path__)[0], "cu13"))')"
fi
export CUDA_ROOT="$cuda_root" CUDA_PATH="$cuda_root" PATH="$cuda_root/bin:$PATH"
nvcc --version | tail -n 2 >&2

# Unversioned library links and the libcuda stub, for the linker only.
linkdir="$root/.cuda/lib"
mkdir -p "$linkdir"
for lib in cublas cublasLt cudart curand nvrtc; do
  found=""
  for dir in "$cuda_root/lib" "$cuda_root/lib64" "$cuda_root/targets/x86_64-linux/lib"; do
    found="$(ls "$dir"/lib$lib.so "$dir"/lib$lib.so.[0-9]* 2>/dev/null | head -n 1 || true)"
    [[ -n "$found" ]] && break
  done
  if [[ -z "$found" ]]; then
    echo "[build_cuda] lib$lib.so not found under $cuda_root" >&2
    exit 1
  fi
  ln -sf "$found" "$linkdir/lib$lib.so"
done
if [[ "$features" == *cudnn* ]]; then
  found=""
  for dir in "$cuda_root/lib" "$cuda_root/lib64" "$cuda_root/targets/x86_64-linux/lib" \
             "$root"/.cuda/venv/lib/python3*/site-packages/nvidia/cudnn/lib; do
    found="$(ls "$dir"/libcudnn.so "$dir"/libcudnn.so.9* 2>/dev/null | head -n 1 || true)"
    [[ -n "$found" ]] && break
  done
  [[ -z "$found" ]] && found="$(ldconfig -p 2>/dev/null | awk '/libcudnn\.so(\.9)? / {print $NF; exit}')"
  if [[ -z "$found" ]]; then
    echo "[build_cuda] libcudnn.so (cuDNN 9) not found: install it, or build without it with" \
         "RANKWISE_CUDA_FEATURES=cuda" >&2
    exit 1
  fi
  ln -sf "$found" "$linkdir/libcudnn.so"
  echo "[build_cuda] cuDNN: $found" >&2
fi
if [[ ! -e "$linkdir/libcuda.so" ]]; then
  python3 - "$cuda_root/include/cuda.h" "$linkdir/cuda_stub.c" <<'EOF'
import re, subprocess, sys
header, out = sys.argv[1], sys.argv[2]
# Both the names the header declares after macro expansion (cuMemAlloc_v2, ...) and the names
# written in it (cuMemAlloc): a binding may link against either.
expanded = subprocess.run(["cc", "-E", "-P", "-I", header.rsplit("/", 1)[0], header],
                          check=True, capture_output=True, text=True).stdout
names = set(re.findall(r"\b(cu[A-Z][A-Za-z0-9_]*)\s*\(", expanded))
names |= set(re.findall(r"\b(cu[A-Z][A-Za-z0-9_]*)\s*\(", open(header).read()))
with open(out, "w") as f:
    f.write("/* Link-time stub of the CUDA driver library: never loaded on a GPU machine. */\n")
    for name in sorted(names):
        f.write(f"int {name}(void) {{ return 999; }}\n")
print(f"[build_cuda] libcuda stub: {len(names)} entry points", file=sys.stderr)
EOF
  cc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$linkdir/libcuda.so" "$linkdir/cuda_stub.c"
fi
export RUSTFLAGS="${RUSTFLAGS:-} -L native=$linkdir"

# The library's own kernels (src/**/*.cu) are compiled by NVRTC when first used on the GPU:
# compile them here with the same NVRTC, so that an error shows on this machine, not there.
nvrtc_lib="$(readlink -f "$linkdir/libnvrtc.so")"
mapfile -t kernels < <(find "$root/src" -name '*.cu' | sort)
LD_LIBRARY_PATH="$(dirname "$nvrtc_lib")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
  python3 "$root/scripts/nvrtc_check.py" "$nvrtc_lib" "${kernels[@]}" >&2

start=$SECONDS
# The source state the binaries are built from, taken before the (long) build: a commit made
# while cargo runs must not be named as theirs.
source_state="commit $(git rev-parse HEAD 2>/dev/null || echo unknown)"
git diff --quiet HEAD -- 2>/dev/null || source_state+=$'\n'"uncommitted changes: $(git status --porcelain | wc -l) files"
if [[ "$mode" == check ]]; then
  cargo check --locked --features "$features" --lib --bins --examples --tests
  echo "[build_cuda] cargo check --features $features passed in $((SECONDS - start)) s" >&2
  exit 0
fi

cargo build --locked --release --features "$features" --bin rankwise ${RANKWISE_CUDA_EXAMPLES:---example gpu_check}
dist="$root/.gpu"
mkdir -p "$dist"
for bin in "$CARGO_TARGET_DIR/release/rankwise" "$CARGO_TARGET_DIR/release/examples/gpu_check"; do
  name="$(basename "$bin")"
  strip -o "$dist/$name" "$bin"
  xz -T0 -6 -f "$dist/$name"
  echo "[build_cuda] $dist/$name.xz: $(du -h "$dist/$name.xz" | cut -f1)" >&2
done
# What the binaries were built from, for the GPU report (scripts/gpu_check.sh copies it).
{
  echo "$source_state"
  echo "built $(date -u +%Y-%m-%dT%H:%M:%SZ), features $features, CUDA_COMPUTE_CAP=$CUDA_COMPUTE_CAP, $(nvcc --version | tail -n 2 | head -n 1)"
} > "$dist/BUILD_INFO"
echo "[build_cuda] built in $((SECONDS - start)) s; on the GPU machine: scripts/gpu_check.sh OUT_DIR" >&2
