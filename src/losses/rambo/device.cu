// RaMBO's ranks, per-item loss terms and blackbox gradient (`losses::rambo`) on a CUDA device,
// by sorting each query's sequence: the module documentation of `device.rs` beside this file
// gives the formulas and the launch order. Compiled at run time by NVRTC (no include, no host
// code), and on the host by the emulation test of that module.
//
// s: the B x B similarities; cls: dense fine classes; norm: each query's normaliser (0 for a
// query without relevant item); rel: each query's number of relevant items in its sequence; the
// sequence of query q is row q without column q unless include_self. objective: 0 AP, 1 recall
// log, 2 recall log log. mags (half_normal only): the B x B half-normal magnitudes of the
// margin, drawn on the host, at each entry's column. Ranks are descending, ties to the earlier
// column (the host's rule), counted exactly in integers and used in double, as the host does.
//
// The counts come from sorted copies of each sequence instead of a scan of it (O(B^2 log^2 B)
// work in all instead of O(B^3)): a row is sorted with its relevant items first, then its
// irrelevant ones, then the query's own entry when it is not in its sequence, each group in
// ranking order. An item's rank is then one plus the items ahead of it in the relevant group
// and in the irrelevant group, each a binary search. The sort is a merge sort without shared
// memory or synchronisation inside a launch (so that the emulation runs it as the device does):
// runs of `tile` entries sorted by counting, then one launch per doubling of the runs, where each
// entry finds its place by a binary search in the run it merges with. Every key is distinct
// (the column breaks ties), so the places form a permutation.

struct rw_rambo {
  unsigned int b;
  int include_self;
  double margin;
  int objective;
  int normalised;
  double lambda;
  double count_scale;
  int half_normal;
  unsigned int tile;
};

// One merge pass: runs of `width` entries merged pairwise, in rows of `stride` entries; a row
// has `len` entries, or rel[q] when per_row (the relevant groups of the perturbed sequences).
struct rw_merge {
  unsigned int stride;
  unsigned int width;
  unsigned int len;
  int per_row;
  int include_self;
};

// Eq. 14: relevant scores lowered by m margin/2, irrelevant ones raised, with m = 1 or the
// entry's half-normal magnitude (the host's arithmetic, operation by operation).
__device__ __forceinline__ double rw_shifted(double s, bool rel, double margin, double m) {
  return s - margin * (m * (rel ? 0.5 : -0.5));
}

__device__ __forceinline__ double rw_units(double rank, const rw_rambo& p, double n) {
  return p.normalised ? rank / n : rank;
}

// Whether entry k (score yk) ranks ahead of entry j (score yj): larger, or equal and earlier.
// A NaN (possible only in a batch the deferred input check will reject) ranks after every
// number, NaNs by column, so that the order stays total and the sort's places a permutation.
__device__ __forceinline__ bool rw_ahead(double yk, unsigned int k, double yj, unsigned int j) {
  const bool nan_k = yk != yk, nan_j = yj != yj;
  if (nan_k || nan_j) return nan_j && (!nan_k || k < j);
  return yk > yj || (yk == yj && k < j);
}

// The group of column k in query q's sorted row: 0 relevant, 1 irrelevant, 2 the query's own
// entry when it is not in its sequence.
__device__ __forceinline__ unsigned int rw_group(const unsigned int* cls, unsigned int q,
                                                 unsigned int k, int include_self) {
  if (k == q && !include_self) return 2;
  return cls[k] == cls[q] ? 0 : 1;
}

// Whether (group ga, score ya, column a) comes before (gb, yb, b) in a sorted row.
__device__ __forceinline__ bool rw_before(unsigned int ga, double ya, unsigned int a,
                                          unsigned int gb, double yb, unsigned int b) {
  return ga < gb || (ga == gb && rw_ahead(ya, a, yb, b));
}

// The number of entries of positions [lo, hi) of a sorted row (keys, columns from `base`) that
// rank ahead of (v, j): those positions hold one group in ranking order, so the entries ahead
// are a prefix, found by binary search.
__device__ __forceinline__ unsigned int rw_count_ahead(const double* key, const unsigned int* col,
                                                       unsigned long long base, unsigned int lo,
                                                       unsigned int hi, double v, unsigned int j) {
  const unsigned int first = lo;
  while (lo < hi) {
    const unsigned int mid = lo + (hi - lo) / 2;
    if (rw_ahead(key[base + mid], col[base + mid], v, j))
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo - first;
}

// dL/drk of a relevant item with ranks rk, rk+ in a query of normaliser w > 0, times the
// incoming gradient, in the ranks' units (the host's arithmetic, operation by operation).
__device__ __forceinline__ double rw_rambo_dl_drk(double rk, double rk_rel, double w,
                                                  double upstream, const rw_rambo& p, double n) {
  if (p.objective == 0) {
    // d(-rk+/rk)/drk = rk+/rk^2, in units.
    const double r = rw_units(rk, p, n), rp = rw_units(rk_rel, p, n);
    return upstream * w * rp / (r * r);
  }
  // l(r) with r = (rk - rk+) * count_scale negatives ahead (Eq. 17-20).
  const double r = (rk - rk_rel) * p.count_scale;
  const double dl = p.objective == 1 ? 1.0 / (1.0 + r) : 1.0 / ((1.0 + log1p(r)) * (1.0 + r));
  const double per_unit = p.normalised ? n : 1.0;
  return upstream * w * dl * p.count_scale * per_unit;
}

// Thread (q, j): entry j of q's shifted sequence y (written at its column, when j is in the
// sequence) and its place in the runs of `tile` entries of the sorted row (key, col): its run's
// entries counted by a scan.
template <typename T>
__device__ void rw_rambo_shift(const T* s, const unsigned int* cls, const double* mags,
                               rw_rambo p, double* y_out, double* key_out,
                               unsigned int* col_out) {
  const unsigned int q = blockIdx.x;
  const unsigned int j = blockIdx.y * blockDim.x + threadIdx.x;
  if (q >= p.b || j >= p.b) return;
  const unsigned long long row = (unsigned long long)q * p.b;
  const unsigned int cq = cls[q];
  const auto shifted = [&](unsigned int k) {
    return rw_shifted((double)s[row + k], cls[k] == cq, p.margin,
                      p.half_normal ? mags[row + k] : 1.0);
  };
  const double yj = shifted(j);
  const unsigned int gj = rw_group(cls, q, j, p.include_self);
  if (gj != 2) y_out[row + j] = yj;
  const unsigned int start = j / p.tile * p.tile;
  const unsigned int end = p.b - start < p.tile ? p.b : start + p.tile;
  unsigned int before = 0;
  for (unsigned int k = start; k < end; ++k)
    if (k != j && rw_before(rw_group(cls, q, k, p.include_self), shifted(k), k, gj, yj, j))
      ++before;
  key_out[row + start + before] = yj;
  col_out[row + start + before] = j;
}

// Thread (q, i): entry i of row q, in a run of m.width sorted entries, placed in the merged run
// of twice the width: its rank in its own run plus the entries of the other run before it.
__device__ void rw_rambo_merge(const double* key_in, const unsigned int* col_in,
                               const unsigned int* cls, const unsigned int* rel, rw_merge m,
                               double* key_out, unsigned int* col_out) {
  const unsigned int q = blockIdx.x;
  const unsigned int i = blockIdx.y * blockDim.x + threadIdx.x;
  const unsigned int n = m.per_row ? rel[q] : m.len;
  if (i >= n) return;
  const unsigned long long row = (unsigned long long)q * m.stride;
  const double v = key_in[row + i];
  const unsigned int a = col_in[row + i];
  const unsigned int ga = rw_group(cls, q, a, m.include_self);
  const unsigned int own = i / m.width * m.width;
  // The other run: the next one for an even run, the previous one for an odd run; none past the
  // row's end.
  const unsigned int other = (i / m.width) % 2 == 0 ? own + m.width : own - m.width;
  unsigned int at = i;
  if (other < n) {
    unsigned int lo = other, hi = n - other < m.width ? n : other + m.width;
    while (lo < hi) {
      const unsigned int mid = lo + (hi - lo) / 2;
      const unsigned int b = col_in[row + mid];
      if (rw_before(rw_group(cls, q, b, m.include_self), key_in[row + mid], b, ga, v, a))
        lo = mid + 1;
      else
        hi = mid;
    }
    at = (own < other ? own : other) + (i - own) + (lo - other);
  }
  key_out[row + at] = v;
  col_out[row + at] = a;
}

// Thread (q, j): rank and rank among the relevant items of j in q's shifted sequence, from the
// sorted row (key, col: rel[q] relevant entries, then the irrelevant ones) and, for a relevant j
// of a query with norm > 0, its term of the loss (times norm).
__device__ void rw_rambo_ranks(const double* y, const double* key, const unsigned int* col,
                               const unsigned int* cls, const unsigned int* rel,
                               const double* norm, rw_rambo p, double* rank_out,
                               double* rank_rel_out, double* term_out) {
  const unsigned int q = blockIdx.x;
  const unsigned int j = blockIdx.y * blockDim.x + threadIdx.x;
  if (q >= p.b || j >= p.b || (!p.include_self && j == q)) return;
  const unsigned long long row = (unsigned long long)q * p.b;
  const unsigned int n = p.include_self ? p.b : p.b - 1, num_rel = rel[q];
  const double yj = y[row + j];
  const unsigned int ahead_rel = rw_count_ahead(key, col, row, 0, num_rel, yj, j);
  const unsigned int ahead = ahead_rel + rw_count_ahead(key, col, row, num_rel, n, yj, j);
  const double rk = 1.0 + (double)ahead, rk_rel = 1.0 + (double)ahead_rel;
  rank_out[row + j] = rk;
  rank_rel_out[row + j] = rk_rel;
  const double w = norm[q];
  if (cls[j] != cls[q] || !(w > 0.0)) return;
  if (p.objective == 0) {
    // Prec(j) = rk+ / rk (Eq. 21).
    term_out[row + j] = rk_rel / rk * w;
  } else {
    const double r = (rk - rk_rel) * p.count_scale;
    term_out[row + j] = (p.objective == 1 ? log1p(r) : log1p(log1p(r))) * w;
  }
}

// Thread (q, k): entry k of q's perturbed sequence y + lambda g (RaMBO Algorithm 1), with g =
// dL/drk (times the incoming gradient *up) of the relevant items and 0 elsewhere, from the
// ranks and shifted sequences of rw_rambo_ranks; y itself where g = 0, as on the host. Written
// once per entry for the sort and the blackbox kernel, which read each entry several times
// (computed there, the divisions and logarithms of g would run that many times). A query's own
// entry, outside its sequence unless include_self, is not written.
template <typename T>
__device__ void rw_rambo_perturb(const unsigned int* cls, const double* norm, rw_rambo p,
                                 const T* up, const double* rank_in, const double* rank_rel_in,
                                 const double* y_in, double* z_out) {
  const unsigned int q = blockIdx.x;
  const unsigned int k = blockIdx.y * blockDim.x + threadIdx.x;
  if (q >= p.b || k >= p.b || (!p.include_self && k == q)) return;
  const unsigned long long at = (unsigned long long)q * p.b + k;
  const double w = norm[q];
  const double y = y_in[at];
  if (cls[k] != cls[q] || !(w > 0.0)) {
    z_out[at] = y;
    return;
  }
  const double n = p.include_self ? (double)p.b : (double)(p.b - 1);
  const double g = rw_rambo_dl_drk(rank_in[at], rank_rel_in[at], w, (double)up[0], p, n);
  z_out[at] = y + p.lambda * g;
}

// Thread (q, i), i < rel[q]: the relevant entry at position i of q's sorted shifted row, keyed
// by its perturbed score, placed in the runs of `tile` entries of the perturbed relevant row
// (rows of `stride` entries): its run's entries counted by a scan. Only the relevant entries
// move (g = 0 elsewhere), so only they are sorted again.
__device__ void rw_rambo_perturbed_tiles(const double* z, const unsigned int* col,
                                         const unsigned int* rel, rw_rambo p, unsigned int stride,
                                         double* key_out, unsigned int* col_out) {
  const unsigned int q = blockIdx.x;
  const unsigned int i = blockIdx.y * blockDim.x + threadIdx.x;
  const unsigned int n = rel[q];
  if (i >= n) return;
  const unsigned long long row = (unsigned long long)q * p.b;
  const unsigned int j = col[row + i];
  const double zj = z[row + j];
  const unsigned int start = i / p.tile * p.tile;
  const unsigned int end = n - start < p.tile ? n : start + p.tile;
  unsigned int before = 0;
  for (unsigned int t = start; t < end; ++t) {
    const unsigned int k = col[row + t];
    if (t != i && rw_ahead(z[row + k], k, zj, j)) ++before;
  }
  const unsigned long long out = (unsigned long long)q * stride + start + before;
  key_out[out] = zj;
  col_out[out] = j;
}

// Thread (q, j): the blackbox gradient -(rk_j - rk_j(z)) / lambda of entry j (RaMBO
// Algorithm 1), in the ranks' units, from its rank in y (rw_rambo_ranks) and its rank in the
// perturbed sequence z: the irrelevant entries ahead of z_j (unmoved: the shifted row's sorted
// irrelevant group) plus the relevant ones (the perturbed relevant row, rows of zstride).
template <typename T>
__device__ void rw_rambo_blackbox(rw_rambo p, const double* rank_in, const double* z_in,
                                  const double* key, const unsigned int* col,
                                  const double* zkey, const unsigned int* zcol,
                                  const unsigned int* rel, unsigned int zstride, T* jac) {
  const unsigned int q = blockIdx.x;
  const unsigned int j = blockIdx.y * blockDim.x + threadIdx.x;
  if (q >= p.b || j >= p.b || (!p.include_self && j == q)) return;
  const unsigned long long row = (unsigned long long)q * p.b;
  const unsigned int n = p.include_self ? p.b : p.b - 1, num_rel = rel[q];
  const double zj = z_in[row + j];
  const unsigned int ahead =
      rw_count_ahead(key, col, row, num_rel, n, zj, j) +
      rw_count_ahead(zkey, zcol, (unsigned long long)q * zstride, 0, num_rel, zj, j);
  const double units = (double)n;
  const double r = rw_units(rank_in[row + j], p, units);
  const double rl = rw_units(1.0 + (double)ahead, p, units);
  jac[row + j] = (T)(-(r - rl) / p.lambda);
}

// Thread q: the sum of query q's terms, in column order (0 where the query has none).
__device__ void rw_rambo_row_sums(const double* term, unsigned int b, double* row_sum) {
  const unsigned int q = blockIdx.x * blockDim.x + threadIdx.x;
  if (q >= b) return;
  const unsigned long long row = (unsigned long long)q * b;
  double sum = 0.0;
  for (unsigned int j = 0; j < b; ++j) sum += term[row + j];
  row_sum[q] = sum;
}

// One thread: the loss from the row sums, summed in query order, plus the stored sequences'
// share memory_value: 1 - total for AP (Eq. 21), the total for recall (Eq. 20).
template <typename T>
__device__ void rw_rambo_total(const double* row_sum, unsigned int b, double memory_value,
                               int objective, T* loss) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  double total = 0.0;
  for (unsigned int q = 0; q < b; ++q) total += row_sum[q];
  total += memory_value;
  *loss = (T)(objective == 0 ? 1.0 - total : total);
}

extern "C" __global__ void rankwise_rambo_merge(const double* key_in, const unsigned int* col_in,
                                                const unsigned int* cls, const unsigned int* rel,
                                                rw_merge m, double* key_out,
                                                unsigned int* col_out) {
  rw_rambo_merge(key_in, col_in, cls, rel, m, key_out, col_out);
}

extern "C" __global__ void rankwise_rambo_ranks(const double* y, const double* key,
                                                const unsigned int* col, const unsigned int* cls,
                                                const unsigned int* rel, const double* norm,
                                                rw_rambo p, double* rank_out,
                                                double* rank_rel_out, double* term_out) {
  rw_rambo_ranks(y, key, col, cls, rel, norm, p, rank_out, rank_rel_out, term_out);
}

extern "C" __global__ void rankwise_rambo_perturbed_tiles(const double* z,
                                                          const unsigned int* col,
                                                          const unsigned int* rel, rw_rambo p,
                                                          unsigned int stride, double* key_out,
                                                          unsigned int* col_out) {
  rw_rambo_perturbed_tiles(z, col, rel, p, stride, key_out, col_out);
}

extern "C" __global__ void rankwise_rambo_row_sums(const double* term, unsigned int b,
                                                   double* row_sum) {
  rw_rambo_row_sums(term, b, row_sum);
}

#define RW_RAMBO_KERNELS(T, SUFFIX)                                                            \
  extern "C" __global__ void rankwise_rambo_shift_##SUFFIX(                                    \
      const T* s, const unsigned int* cls, const double* mags, rw_rambo p, double* y_out,      \
      double* key_out, unsigned int* col_out) {                                                \
    rw_rambo_shift<T>(s, cls, mags, p, y_out, key_out, col_out);                               \
  }                                                                                            \
  extern "C" __global__ void rankwise_rambo_perturb_##SUFFIX(                                   \
      const unsigned int* cls, const double* norm, rw_rambo p, const T* up,                    \
      const double* rank_in, const double* rank_rel_in, const double* y_in, double* z_out) {   \
    rw_rambo_perturb<T>(cls, norm, p, up, rank_in, rank_rel_in, y_in, z_out);                  \
  }                                                                                            \
  extern "C" __global__ void rankwise_rambo_blackbox_##SUFFIX(                                 \
      rw_rambo p, const double* rank_in, const double* z_in, const double* key,                \
      const unsigned int* col, const double* zkey, const unsigned int* zcol,                   \
      const unsigned int* rel, unsigned int zstride, T* jac) {                                 \
    rw_rambo_blackbox<T>(p, rank_in, z_in, key, col, zkey, zcol, rel, zstride, jac);           \
  }                                                                                            \
  extern "C" __global__ void rankwise_rambo_total_##SUFFIX(                                    \
      const double* row_sum, unsigned int b, double memory_value, int objective, T* loss) {    \
    rw_rambo_total<T>(row_sum, b, memory_value, objective, loss);                              \
  }

RW_RAMBO_KERNELS(float, f32)
RW_RAMBO_KERNELS(double, f64)
