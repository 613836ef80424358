// FastAP's soft histograms, per-query values and exact (or the authors' port's) gradient
// (`losses::fastap`) on a CUDA device: the module documentation of `device.rs` beside this file
// gives the formulas. Compiled at run time by NVRTC (no include, no host code), and on the host
// by the emulation test of that module. The arithmetic is the host row engine's, operation by
// operation (the window of four bins, the kernel's division-free zero, the cumulative sums'
// order), in double.
//
// s: the B x B similarities; cls: dense fine classes; centres: the nb = L + 1 bin centres;
// scratch: 2 nb doubles per query (the histograms, then the partials); fastap: one per query.

struct rw_bins {
  unsigned int b;
  unsigned int nb;
  double delta;
  double inv_delta;
  int port;  // the authors' port's kernel derivative and scale
  double scale;
};

// The bins lo..=hi whose kernel can be non-zero at d (the host's `Bins::window`).
__device__ __forceinline__ void rw_window(double d, const rw_bins& p, int* lo, int* hi) {
  const double t = d * p.inv_delta;
  const long long trunc = (long long)t;
  const long long idx = ((double)trunc > t) ? trunc - 1 : trunc;
  const long long last = (long long)p.nb - 1;
  long long a = idx - 1, c = idx + 2;
  a = a < 0 ? 0 : (a > last ? last : a);
  c = c < 0 ? 0 : (c > last ? last : c);
  *lo = (int)a;
  *hi = (int)c;
}

// The triangular kernel max(0, 1 - |d - z| / delta) (the host's `Bins::kernel`).
__device__ __forceinline__ double rw_kernel(double d, double z, double delta) {
  const double gap = fabs(d - z);
  if (gap >= delta) return 0.0;
  const double v = 1.0 - gap / delta;
  return v > 0.0 ? v : 0.0;
}

// d(kernel)/dd: autograd's (sign(0) = 0) or the port's one-sided `dSoftBinning`.
__device__ __forceinline__ double rw_slope(double d, double z, const rw_bins& p) {
  if (p.port) {
    const bool rising = d > z - p.delta && d <= z;
    const bool falling = d > z && d <= z + p.delta;
    return ((double)rising - (double)falling) / p.delta;
  }
  if (fabs(d - z) < p.delta) {
    if (d > z) return -1.0 / p.delta;
    if (d < z) return 1.0 / p.delta;
  }
  return 0.0;
}

// Thread q: q's histograms over its retrieval set (every other item), its FastAP and the
// partials dFastAP/dh+_l, dFastAP/dh-_l (left in scratch in place of the histograms).
template <typename T>
__device__ void rw_fastap_rows(const T* s, const unsigned int* cls, const double* centres,
                               rw_bins p, double* scratch, double* fastap) {
  const unsigned int q = blockIdx.x * blockDim.x + threadIdx.x;
  if (q >= p.b) return;
  const unsigned long long row = (unsigned long long)q * p.b;
  double* pos = scratch + (unsigned long long)q * 2 * p.nb;
  double* neg = pos + p.nb;
  for (unsigned int l = 0; l < p.nb; ++l) pos[l] = neg[l] = 0.0;
  const unsigned int cq = cls[q];
  double num_pos = 0.0;
  for (unsigned int j = 0; j < p.b; ++j) {
    if (j == q) continue;
    const double d = 2.0 - 2.0 * (double)s[row + j];
    const bool positive = cls[j] == cq;
    if (positive) num_pos += 1.0;
    double* hist = positive ? pos : neg;
    int lo, hi;
    rw_window(d, p, &lo, &hi);
    for (int l = lo; l <= hi; ++l) hist[l] += rw_kernel(d, centres[l], p.delta);
  }
  if (num_pos == 0.0) {
    fastap[q] = 0.0;
    for (unsigned int l = 0; l < p.nb; ++l) pos[l] = neg[l] = 0.0;
    return;
  }
  // FastAP = (1/N+) sum_l h+_l H+_l / H_l, the cumulative sums in the host's order.
  double hp = 0.0, h = 0.0, sum = 0.0;
  for (unsigned int l = 0; l < p.nb; ++l) {
    hp += pos[l];
    h += pos[l] + neg[l];
    const double num = pos[l] * hp;
    if (num > 0.0 && h > 0.0) sum += num / h;
  }
  fastap[q] = sum / num_pos;
  // Partials from the last bin down; H+_l, H_l recovered by removing bins from the totals
  // would round differently, so they are recomputed from the front for each l.
  const double inv_n = 1.0 / num_pos;
  double tail_pos = 0.0, tail_neg = 0.0;
  for (int l = (int)p.nb - 1; l >= 0; --l) {
    double cum_pos = 0.0, cum_all = 0.0;
    for (int k = 0; k <= l; ++k) {
      cum_pos += pos[k];
      cum_all += pos[k] + neg[k];
    }
    const double h2 = cum_all * cum_all;
    if (h2 > 0.0) {
      const double cum_neg = cum_all - cum_pos;
      tail_pos += pos[l] * cum_neg / h2;
      tail_neg += pos[l] * cum_pos / h2;
    }
    const double ratio = cum_all > 0.0 ? cum_pos / cum_all : 0.0;
    pos[l] = inv_n * (ratio + tail_pos);
    neg[l] = -inv_n * tail_neg;
  }
}

// Thread (q, j): dLoss/ds_qj = scale * sum over the window of partial_l * slope_l (d = 2 - 2s).
template <typename T>
__device__ void rw_fastap_grad(const T* s, const unsigned int* cls, const double* centres,
                               rw_bins p, const double* scratch, double* jac) {
  const unsigned int q = blockIdx.x;
  const unsigned int j = blockIdx.y * blockDim.x + threadIdx.x;
  if (q >= p.b || j >= p.b || j == q) return;
  const unsigned long long row = (unsigned long long)q * p.b;
  const double* partial = scratch + (unsigned long long)q * 2 * p.nb;
  if (cls[j] != cls[q]) partial += p.nb;
  const double d = 2.0 - 2.0 * (double)s[row + j];
  int lo, hi;
  rw_window(d, p, &lo, &hi);
  double coeff = 0.0;
  for (int l = lo; l <= hi; ++l) coeff += partial[l] * rw_slope(d, centres[l], p);
  jac[row + j] = p.scale * coeff;
}

// One thread: the loss 1 - sum_q FastAP_q / N_valid, the queries summed in order.
template <typename T>
__device__ void rw_fastap_total(const double* fastap, unsigned int b, double valid, T* loss) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  double sum = 0.0;
  for (unsigned int q = 0; q < b; ++q) sum += fastap[q];
  *loss = (T)(1.0 - sum / valid);
}

// One thread per entry (q, j) (block x: the query; its threads and block y: the item): the
// backward pass ds = g J, g the loss's incoming gradient read on the device.
template <typename T>
__device__ void rw_fastap_chain(const double* jac, const T* g, T* ds, unsigned int b) {
  const unsigned int q = blockIdx.x;
  const unsigned int j = blockIdx.y * blockDim.x + threadIdx.x;
  if (q >= b || j >= b) return;
  const unsigned long long at = (unsigned long long)q * b + j;
  ds[at] = (T)((double)g[0] * jac[at]);
}

#define RW_FASTAP_KERNELS(T, SUFFIX)                                                           \
  extern "C" __global__ void rankwise_fastap_rows_##SUFFIX(const T* s, const unsigned int* cls, \
                                                           const double* centres, rw_bins p,    \
                                                           double* scratch, double* fastap) {   \
    rw_fastap_rows<T>(s, cls, centres, p, scratch, fastap);                                    \
  }                                                                                            \
  extern "C" __global__ void rankwise_fastap_grad_##SUFFIX(                                    \
      const T* s, const unsigned int* cls, const double* centres, rw_bins p,                   \
      const double* scratch, double* jac) {                                                    \
    rw_fastap_grad<T>(s, cls, centres, p, scratch, jac);                                       \
  }                                                                                            \
  extern "C" __global__ void rankwise_fastap_total_##SUFFIX(const double* fastap, unsigned int b, \
                                                           double valid, T* loss) {            \
    rw_fastap_total<T>(fastap, b, valid, loss);                                                \
  }                                                                                            \
  extern "C" __global__ void rankwise_fastap_chain_##SUFFIX(const double* jac, const T* g,      \
                                                           T* ds, unsigned int b) {            \
    rw_fastap_chain<T>(jac, g, ds, b);                                                         \
  }

RW_FASTAP_KERNELS(float, f32)
RW_FASTAP_KERNELS(double, f64)
