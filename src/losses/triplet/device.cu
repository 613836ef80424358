// The triplet minings of `losses::triplet` on a CUDA device: for every anchor a and item j of
// the batch, the number of active triplets j takes part in (+k as a positive, -k as a negative)
// and, for a positive, the sum of their costs. The module documentation of `device.rs` beside
// this file gives the formulas. Compiled at run time by NVRTC (no include, no host code), and on
// the host by the emulation test of that module.
//
// x is the B x B matrix of distance-like values (x = -s for cosine similarities), cls the dense
// fine class of each item. The minings' outputs (B x B doubles, zero-initialised by the caller):
// counts and partial sums. Then their reduction to the loss (each anchor's row, the total) and
// the gradient with respect to x. Every comparison, cost and sum is in double, as the host's row
// engine computes them.

// Whether the triplet (x_p, x_n) is mined and costs something: mining 0 = all, 1 = semi-hard.
__device__ __forceinline__ bool rw_triplet_active(double xp, double xn, double margin,
                                                   int mining) {
  const double v = (xp - xn) + margin;
  if (!(v > 0.0)) return false;
  if (mining == 1) return (xn - xp) > 0.0 && (xn - xp) <= margin;
  return true;
}

// Thread (a, j), mining all or semi-hard: j's active triplets with anchor a. A positive j pairs
// with every negative (a scan of the row that skips the positives), a negative j with the
// positives of a alone: the items of a's class, listed on the host (class c's are
// class_items[class_start[c] .. class_start[c + 1]], in increasing order), so a negative's thread
// does O(P) work, not O(B) — in a batch of m images per class, most threads are negatives'.
template <typename T>
__device__ void rw_triplet_pairs(const T* x, const unsigned int* cls,
                                 const unsigned int* class_start,
                                 const unsigned int* class_items, unsigned int b, double margin,
                                 int mining, double* counts, double* partial) {
  const unsigned int a = blockIdx.x;
  const unsigned int j = blockIdx.y * blockDim.x + threadIdx.x;
  if (a >= b || j >= b || j == a) return;
  const unsigned long long row = (unsigned long long)a * b;
  const unsigned int ca = cls[a];
  const double xj = (double)x[row + j];
  double k = 0.0, sum = 0.0;
  if (cls[j] == ca) {
    for (unsigned int i = 0; i < b; ++i) {
      if (cls[i] == ca) continue;
      const double xn = (double)x[row + i];
      if (rw_triplet_active(xj, xn, margin, mining)) {
        k += 1.0;
        sum += (xj - xn) + margin;
      }
    }
    counts[row + j] = k;
    partial[row + j] = sum;
  } else {
    const unsigned int end = class_start[ca + 1];
    for (unsigned int e = class_start[ca]; e < end; ++e) {
      const unsigned int i = class_items[e];
      if (i == a) continue;
      const double xp = (double)x[row + i];
      if (rw_triplet_active(xp, xj, margin, mining)) k += 1.0;
    }
    counts[row + j] = -k;
    partial[row + j] = 0.0;
  }
}

// Thread a, easy positive / semi-hard negative: the closest positive p (first column on ties),
// then the closest negative n farther than it (first on ties); one triplet if it costs.
template <typename T>
__device__ void rw_triplet_easy(const T* x, const unsigned int* cls, unsigned int b,
                                double margin, double* counts, double* partial) {
  const unsigned int a = blockIdx.x * blockDim.x + threadIdx.x;
  if (a >= b) return;
  const unsigned long long row = (unsigned long long)a * b;
  const unsigned int ca = cls[a];
  long long p = -1;
  double xp = 0.0;
  for (unsigned int j = 0; j < b; ++j) {
    if (j == a || cls[j] != ca) continue;
    const double xj = (double)x[row + j];
    if (p < 0 || xj < xp) {
      p = j;
      xp = xj;
    }
  }
  if (p < 0) return;
  long long n = -1;
  double xn = 0.0;
  for (unsigned int j = 0; j < b; ++j) {
    if (cls[j] == ca) continue;
    const double xj = (double)x[row + j];
    if (xj > xp && (n < 0 || xj < xn)) {
      n = j;
      xn = xj;
    }
  }
  if (n < 0) return;
  const double v = (xp - xn) + margin;
  if (v > 0.0) {
    counts[row + p] = 1.0;
    counts[row + n] = -1.0;
    partial[row + p] = v;
  }
}

// One thread per anchor a (grid-stride): its active triplets (the positive counts of its row)
// and the sum of their costs, into rows[2 a], rows[2 a + 1].
__device__ void rw_triplet_rows(const double* counts, const double* partial, unsigned int b,
                                double* rows) {
  const unsigned long long first = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
  const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
  for (unsigned long long a = first; a < b; a += stride) {
    const unsigned long long row = a * b;
    double active = 0.0, cost = 0.0;
    for (unsigned int j = 0; j < b; ++j) {
      const double k = counts[row + j];
      if (k > 0.0) active += k;
      cost += partial[row + j];
    }
    rows[2 * a] = active;
    rows[2 * a + 1] = cost;
  }
}

// One thread: the anchors' rows summed in order; K the active triplets, the loss their mean
// cost (0 when K = 0: every cost is then 0 and the divisor max(K, 1)). Writes the loss and the
// divisor, which the gradient reads.
template <typename T>
__device__ void rw_triplet_total(const double* rows, unsigned int b, T* loss, double* divisor) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  double active = 0.0, cost = 0.0;
  for (unsigned int a = 0; a < b; ++a) {
    active += rows[2 * a];
    cost += rows[2 * a + 1];
  }
  const double d = active > 1.0 ? active : 1.0;
  *loss = (T)(cost / d);
  *divisor = d;
}

// One thread per entry (a, j) (block x: the anchor; its threads and block y: the item):
// dx_aj = g (k+_aj - k-_aj) / max(K, 1), g the loss's incoming gradient read on the device.
template <typename T>
__device__ void rw_triplet_grad(const double* counts, const double* divisor, const T* g, T* dx,
                                unsigned int b) {
  const unsigned int a = blockIdx.x;
  const unsigned int j = blockIdx.y * blockDim.x + threadIdx.x;
  if (a >= b || j >= b) return;
  const unsigned long long at = (unsigned long long)a * b + j;
  dx[at] = (T)((double)g[0] * (counts[at] / divisor[0]));
}

extern "C" __global__ void rankwise_triplet_rows(const double* counts, const double* partial,
                                                 unsigned int b, double* rows) {
  rw_triplet_rows(counts, partial, b, rows);
}

#define RW_TRIPLET_KERNELS(T, SUFFIX)                                                          \
  extern "C" __global__ void rankwise_triplet_pairs_##SUFFIX(                                  \
      const T* x, const unsigned int* cls, const unsigned int* class_start,                    \
      const unsigned int* class_items, unsigned int b, double margin, int mining,              \
      double* counts, double* partial) {                                                       \
    rw_triplet_pairs<T>(x, cls, class_start, class_items, b, margin, mining, counts, partial);  \
  }                                                                                            \
  extern "C" __global__ void rankwise_triplet_easy_##SUFFIX(                                   \
      const T* x, const unsigned int* cls, unsigned int b, double margin, double* counts,      \
      double* partial) {                                                                       \
    rw_triplet_easy<T>(x, cls, b, margin, counts, partial);                                    \
  }                                                                                            \
  extern "C" __global__ void rankwise_triplet_total_##SUFFIX(const double* rows, unsigned int b, \
                                                            T* loss, double* divisor) {        \
    rw_triplet_total<T>(rows, b, loss, divisor);                                               \
  }                                                                                            \
  extern "C" __global__ void rankwise_triplet_grad_##SUFFIX(                                   \
      const double* counts, const double* divisor, const T* g, T* dx, unsigned int b) {       \
    rw_triplet_grad<T>(counts, divisor, g, dx, b);                                             \
  }

RW_TRIPLET_KERNELS(float, f32)
RW_TRIPLET_KERNELS(double, f64)
