// The losses' L2 normalisation `ê = x / ‖x‖` on a CUDA device (`losses::normalize`), given the
// row norms: the division, and its whole gradient in one pass,
//
//   ∂x_i = (g_i − ê_i (ê_i · g_i)) / ‖x_i‖,
//
// where candle's autograd of `x / sqrt(Σ x²)` takes about a dozen launches (the division's two
// gradients, the square root's, the sum's broadcast, the square's, and their sum). Compiled at
// run time by NVRTC (no include, no host code), and on the host by the emulation test of that
// module.

__device__ __forceinline__ unsigned long long rw_unit_first() {
  return (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ unsigned long long rw_unit_stride() {
  return (unsigned long long)gridDim.x * blockDim.x;
}

// y = x / n[row], one thread per value of the `rows × d` matrix (grid-stride): the same
// correctly rounded division as candle's `broadcast_div`.
template <typename T>
__device__ void rw_unit_rows(const T* x, const T* n, T* y, unsigned long long rows,
                             unsigned long long d) {
  const unsigned long long total = rows * d;
  for (unsigned long long i = rw_unit_first(); i < total; i += rw_unit_stride())
    y[i] = x[i] / n[i / d];
}

// dx = (g − y (y · g)) / n, one thread per row (grid-stride).
template <typename T>
__device__ void rw_unit_rows_grad(const T* y, const T* n, const T* g, T* dx,
                                  unsigned long long rows, unsigned long long d) {
  for (unsigned long long r = rw_unit_first(); r < rows; r += rw_unit_stride()) {
    const T* yr = y + r * d;
    const T* gr = g + r * d;
    T dot = (T)0;
    for (unsigned long long j = 0; j < d; ++j) dot += yr[j] * gr[j];
    const T nr = n[r];
    T* out = dx + r * d;
    for (unsigned long long j = 0; j < d; ++j) out[j] = (gr[j] - yr[j] * dot) / nr;
  }
}

#define RW_UNIT_KERNELS(T, SUFFIX)                                                            \
  extern "C" __global__ void rankwise_unit_rows_##SUFFIX(                                     \
      const T* x, const T* n, T* y, unsigned long long rows, unsigned long long d) {          \
    rw_unit_rows<T>(x, n, y, rows, d);                                                        \
  }                                                                                           \
  extern "C" __global__ void rankwise_unit_rows_grad_##SUFFIX(                                \
      const T* y, const T* n, const T* g, T* dx, unsigned long long rows,                     \
      unsigned long long d) {                                                                 \
    rw_unit_rows_grad<T>(y, n, g, dx, rows, d);                                               \
  }

RW_UNIT_KERNELS(float, f32)
RW_UNIT_KERNELS(double, f64)
