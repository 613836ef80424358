// The verdicts of the losses' deferred input checks (`losses::guard`) on a CUDA device: one
// thread per value (grid-stride) over a tensor's `n` values; a value that fails writes `nan`
// into the `f32` flag `out[0]`, which the host zeroed and which every check of a loss call
// shares, so that it is 0 when every value of every check passes and NaN otherwise (threads
// that fail all write the same value: their order does not matter).
// Compiled at run time by NVRTC (no include, no host code), and on the host by the emulation
// test of that module.
//
// Finiteness is `v - v == 0`, false for NaN and the infinities, with no library function, so
// that NVRTC and the host compiler read it alike; the tensor operations of the path without
// kernels compute the same sums.

__device__ __forceinline__ unsigned long long rw_guard_first() {
  return (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ unsigned long long rw_guard_stride() {
  return (unsigned long long)gridDim.x * blockDim.x;
}

template <typename T>
__device__ __forceinline__ bool rw_guard_is_finite(T v) {
  return v - v == (T)0;
}

// Every value finite.
template <typename T>
__device__ void rw_guard_finite(const T* x, unsigned long long n, float nan, float* out) {
  for (unsigned long long i = rw_guard_first(); i < n; i += rw_guard_stride())
    if (!rw_guard_is_finite(x[i])) out[0] = nan;
}

// Every value (a row's norm) finite, with a finite reciprocal: not zero.
template <typename T>
__device__ void rw_guard_norm(const T* x, unsigned long long n, float nan, float* out) {
  for (unsigned long long i = rw_guard_first(); i < n; i += rw_guard_stride()) {
    const T v = x[i];
    if (!rw_guard_is_finite(v) || !rw_guard_is_finite((T)1 / v)) out[0] = nan;
  }
}

#define RW_GUARD_KERNELS(T, SUFFIX)                                                      \
  extern "C" __global__ void rankwise_guard_finite_##SUFFIX(                             \
      const T* x, unsigned long long n, float nan, float* out) {                         \
    rw_guard_finite<T>(x, n, nan, out);                                                  \
  }                                                                                      \
  extern "C" __global__ void rankwise_guard_norm_##SUFFIX(                               \
      const T* x, unsigned long long n, float nan, float* out) {                         \
    rw_guard_norm<T>(x, n, nan, out);                                                    \
  }

RW_GUARD_KERNELS(float, f32)
RW_GUARD_KERNELS(double, f64)
