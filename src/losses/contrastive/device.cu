// The contrastive loss of `losses::contrastive` on a CUDA device, from the B x B similarity
// matrix s and the dense fine class of each item: the module documentation of `device.rs`
// beside this file gives the formulas. Three kernels: each row's sums and counts, their total
// (the loss and the two divisors), and the gradient with respect to s. Every cost, slope and sum
// is in double, as the host's row engine computes them (`contrastive::pair_cost`). Compiled at
// run time by NVRTC (no include, no host code), and on the host by the emulation test of that
// module.

__device__ __forceinline__ unsigned long long rw_pair_first() {
  return (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ unsigned long long rw_pair_stride() {
  return (unsigned long long)gridDim.x * blockDim.x;
}

// The cost of the pair with similarity s and its derivative in s (both 0 where the cost is
// clamped at 0, NaN included): `contrastive::pair_cost`. euclidean = 0: cosine similarity,
// positives cost m+ - s, negatives s - m-; 1: distance d = sqrt(max(0, 2 - 2s)), positives cost
// d - m+, negatives m- - d, dd/ds = -1/d (0 at d = 0, as torch's cdist).
__device__ __forceinline__ void rw_pair_cost(double s, bool positive, unsigned int euclidean,
                                             double pos_margin, double neg_margin, double* cost,
                                             double* slope) {
  double v, dv;
  if (euclidean) {
    const double t = 2.0 - 2.0 * s;
    const double d = sqrt(t > 0.0 ? t : 0.0);
    const double dd = d > 0.0 ? -1.0 / d : 0.0;
    v = positive ? d - pos_margin : neg_margin - d;
    dv = positive ? dd : -dd;
  } else {
    v = positive ? pos_margin - s : s - neg_margin;
    dv = positive ? -1.0 : 1.0;
  }
  const bool active = v > 0.0;
  *cost = active ? v : 0.0;
  *slope = active ? dv : 0.0;
}

// One thread per row i (grid-stride): over j != i in order, the positive pairs' cost sum, their
// number with a non-zero cost and their number, then the same for the negatives, into
// partial[6 i .. 6 i + 6].
template <typename T>
__device__ void rw_pair_rows(const T* s, const unsigned int* cls, double* partial,
                             unsigned long long b, double pos_margin, double neg_margin,
                             unsigned int euclidean) {
  for (unsigned long long i = rw_pair_first(); i < b; i += rw_pair_stride()) {
    const T* row = s + i * b;
    const unsigned int ci = cls[i];
    double pos_sum = 0.0, neg_sum = 0.0;
    unsigned long long pos_active = 0, pos_pairs = 0, neg_active = 0, neg_pairs = 0;
    for (unsigned long long j = 0; j < b; ++j) {
      if (j == i) continue;
      const bool positive = cls[j] == ci;
      double cost, slope;
      rw_pair_cost((double)row[j], positive, euclidean, pos_margin, neg_margin, &cost, &slope);
      if (positive) {
        ++pos_pairs;
        if (cost > 0.0) {
          pos_sum += cost;
          ++pos_active;
        }
      } else {
        ++neg_pairs;
        if (cost > 0.0) {
          neg_sum += cost;
          ++neg_active;
        }
      }
    }
    double* out = partial + 6 * i;
    out[0] = pos_sum;
    out[1] = (double)pos_active;
    out[2] = (double)pos_pairs;
    out[3] = neg_sum;
    out[4] = (double)neg_active;
    out[5] = (double)neg_pairs;
  }
}

// One thread: the rows' partials summed in row order; each term is its sum over its divisor
// (the pairs with a non-zero cost, or with mean = 1 all its pairs; 0 without any). Writes the
// loss and, for the gradient, the two divisors (0 for an absent term).
template <typename T>
__device__ void rw_pair_total(const double* partial, T* loss, double* divisors,
                              unsigned long long b, unsigned int mean) {
  if (rw_pair_first() != 0) return;
  double sums[6] = {0.0, 0.0, 0.0, 0.0, 0.0, 0.0};
  for (unsigned long long i = 0; i < b; ++i)
    for (int k = 0; k < 6; ++k) sums[k] += partial[6 * i + k];
  const double pos_div = mean ? sums[2] : sums[1];
  const double neg_div = mean ? sums[5] : sums[4];
  const double pos = pos_div > 0.0 ? sums[0] / pos_div : 0.0;
  const double neg = neg_div > 0.0 ? sums[3] / neg_div : 0.0;
  *loss = (T)(pos + neg);
  divisors[0] = pos_div;
  divisors[1] = neg_div;
}

// One thread per entry (i, j) (block x: the row, its threads and block y the column): ds_ij =
// g * slope_ij / divisor of the pair's kind, 0 on the diagonal and where the pair costs nothing.
// g is the loss's incoming gradient, read on the device.
template <typename T>
__device__ void rw_pair_grad(const T* s, const unsigned int* cls, const double* divisors,
                             const T* g, T* ds, unsigned long long b, double pos_margin,
                             double neg_margin, unsigned int euclidean) {
  const unsigned long long i = blockIdx.x;
  const unsigned long long j = (unsigned long long)blockIdx.y * blockDim.x + threadIdx.x;
  if (i >= b || j >= b) return;
  const unsigned long long at = i * b + j;
  if (i == j) {
    ds[at] = (T)0;
    return;
  }
  const bool positive = cls[j] == cls[i];
  double cost, slope;
  rw_pair_cost((double)s[at], positive, euclidean, pos_margin, neg_margin, &cost, &slope);
  const double divisor = positive ? divisors[0] : divisors[1];
  ds[at] = slope != 0.0 ? (T)((double)g[0] * slope / divisor) : (T)0;
}

#define RW_PAIR_KERNELS(T, SUFFIX)                                                              \
  extern "C" __global__ void rankwise_pair_rows_##SUFFIX(                                       \
      const T* s, const unsigned int* cls, double* partial, unsigned long long b,               \
      double pos_margin, double neg_margin, unsigned int euclidean) {                           \
    rw_pair_rows<T>(s, cls, partial, b, pos_margin, neg_margin, euclidean);                     \
  }                                                                                             \
  extern "C" __global__ void rankwise_pair_total_##SUFFIX(                                      \
      const double* partial, T* loss, double* divisors, unsigned long long b,                   \
      unsigned int mean) {                                                                      \
    rw_pair_total<T>(partial, loss, divisors, b, mean);                                         \
  }                                                                                             \
  extern "C" __global__ void rankwise_pair_grad_##SUFFIX(                                       \
      const T* s, const unsigned int* cls, const double* divisors, const T* g, T* ds,           \
      unsigned long long b, double pos_margin, double neg_margin, unsigned int euclidean) {     \
    rw_pair_grad<T>(s, cls, divisors, g, ds, b, pos_margin, neg_margin, euclidean);             \
  }

RW_PAIR_KERNELS(float, f32)
RW_PAIR_KERNELS(double, f64)
