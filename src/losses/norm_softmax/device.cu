// The mean softmax cross-entropy of `losses::norm_softmax` on a CUDA device, from the B x C
// cosines z (or logits, scale 1), the scale s = 1/sigma and each row's target column: the module
// documentation of `device.rs` beside this file gives the formulas. Four kernels: each row's
// log-sum-exp in `lanes` interleaved parts, their merge with the row's loss, the rows' mean, and
// the gradient with respect to z. Every exponential, logarithm and sum is in double. Compiled at
// run time by NVRTC (no include, no host code), and on the host by the emulation test of that
// module.

// One thread per (row i, lane k < lanes) (block x: the row; its threads and block y: the lane):
// over the columns k, k + lanes, k + 2 lanes, ... of row i, the largest scaled logit m and
// sum_c exp(s z_ic - m), by the running rescaling of the online softmax, into partial[2 (i lanes
// + k) ..]. Every lane has at least one column (lanes <= C).
template <typename T>
__device__ void rw_ce_parts(const T* z, double* partial, unsigned long long b,
                            unsigned long long c, unsigned long long lanes, double scale) {
  const unsigned long long i = blockIdx.x;
  const unsigned long long k = (unsigned long long)blockIdx.y * blockDim.x + threadIdx.x;
  if (i >= b || k >= lanes) return;
  const T* row = z + i * c;
  double m = 0.0, sum = 0.0;
  for (unsigned long long col = k; col < c; col += lanes) {
    const double v = scale * (double)row[col];
    if (sum == 0.0) {
      // The lane's first value (sum is at least 1 afterwards).
      m = v;
      sum = 1.0;
    } else if (v > m) {
      sum = sum * exp(m - v) + 1.0;
      m = v;
    } else {
      sum += exp(v - m);
    }
  }
  double* out = partial + 2 * (i * lanes + k);
  out[0] = m;
  out[1] = sum;
}

// One thread per row i (grid-stride): the lanes' parts merged in lane order, lse_i = M +
// log sum_k sum_k exp(m_k - M) with M the largest m_k, and the row's loss lse_i - s z_{i,y_i}.
template <typename T>
__device__ void rw_ce_rows(const T* z, const double* partial, const unsigned int* target,
                           double* lse, double* row_loss, unsigned long long b,
                           unsigned long long c, unsigned long long lanes, double scale) {
  const unsigned long long first = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
  const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
  for (unsigned long long i = first; i < b; i += stride) {
    const double* p = partial + 2 * i * lanes;
    double top = p[0];
    for (unsigned long long k = 1; k < lanes; ++k)
      if (p[2 * k] > top) top = p[2 * k];
    double sum = 0.0;
    for (unsigned long long k = 0; k < lanes; ++k) sum += p[2 * k + 1] * exp(p[2 * k] - top);
    const double l = top + log(sum);
    lse[i] = l;
    row_loss[i] = l - scale * (double)z[i * c + target[i]];
  }
}

// One thread: the rows' losses summed in row order, over B.
template <typename T>
__device__ void rw_ce_total(const double* row_loss, T* loss, unsigned long long b) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  double total = 0.0;
  for (unsigned long long i = 0; i < b; ++i) total += row_loss[i];
  *loss = (T)(total / (double)b);
}

// One thread per entry (i, j) (block x: the row; its threads and block y: the column):
// dz_ij = g s / B (exp(s z_ij - lse_i) - [j = y_i]), g the loss's incoming gradient read on the
// device.
template <typename T>
__device__ void rw_ce_grad(const T* z, const unsigned int* target, const double* lse, const T* g,
                           T* dz, unsigned long long b, unsigned long long c, double scale) {
  const unsigned long long i = blockIdx.x;
  const unsigned long long j = (unsigned long long)blockIdx.y * blockDim.x + threadIdx.x;
  if (i >= b || j >= c) return;
  const unsigned long long at = i * c + j;
  const double p = exp(scale * (double)z[at] - lse[i]);
  const double d = j == target[i] ? p - 1.0 : p;
  dz[at] = (T)((double)g[0] * scale / (double)b * d);
}

#define RW_CE_KERNELS(T, SUFFIX)                                                                \
  extern "C" __global__ void rankwise_ce_parts_##SUFFIX(                                        \
      const T* z, double* partial, unsigned long long b, unsigned long long c,                  \
      unsigned long long lanes, double scale) {                                                 \
    rw_ce_parts<T>(z, partial, b, c, lanes, scale);                                             \
  }                                                                                             \
  extern "C" __global__ void rankwise_ce_rows_##SUFFIX(                                         \
      const T* z, const double* partial, const unsigned int* target, double* lse,               \
      double* row_loss, unsigned long long b, unsigned long long c, unsigned long long lanes,   \
      double scale) {                                                                           \
    rw_ce_rows<T>(z, partial, target, lse, row_loss, b, c, lanes, scale);                       \
  }                                                                                             \
  extern "C" __global__ void rankwise_ce_total_##SUFFIX(const double* row_loss, T* loss,        \
                                                        unsigned long long b) {                 \
    rw_ce_total<T>(row_loss, loss, b);                                                          \
  }                                                                                             \
  extern "C" __global__ void rankwise_ce_grad_##SUFFIX(                                         \
      const T* z, const unsigned int* target, const double* lse, const T* g, T* dz,             \
      unsigned long long b, unsigned long long c, double scale) {                               \
    rw_ce_grad<T>(z, target, lse, g, dz, b, c, scale);                                          \
  }

RW_CE_KERNELS(float, f32)
RW_CE_KERNELS(double, f64)
