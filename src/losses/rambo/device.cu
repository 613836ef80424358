// RaMBO's ranks, per-item loss terms and blackbox gradient (`losses::rambo`) on a CUDA device,
// one thread per (query, item): the module documentation of `device.rs` beside this file gives
// the formulas. Compiled at run time by NVRTC (no include, no host code), and on the host by the
// emulation test of that module.
//
// s: the B x B similarities; cls: dense fine classes; norm: each query's normaliser (0 for a
// query without relevant item); the sequence of query q is row q without column q unless
// include_self. objective: 0 AP, 1 recall log, 2 recall log log. mags (half_normal only): the
// B x B half-normal magnitudes of the margin, drawn on the host, at each entry's column. Ranks
// are descending, ties to the earlier column (the host's rule), counted exactly in integers and
// used in double, as the host does. The first kernel writes the shifted sequences y; in the
// backward pass one kernel perturbs them (y + lambda g) and the blackbox kernel ranks within the
// perturbed sequences.

struct rw_rambo {
  unsigned int b;
  int include_self;
  double margin;
  int objective;
  int normalised;
  double lambda;
  double count_scale;
  int half_normal;
};

// Eq. 14: relevant scores lowered by m margin/2, irrelevant ones raised, with m = 1 or the
// entry's half-normal magnitude (the host's arithmetic, operation by operation).
__device__ __forceinline__ double rw_shifted(double s, bool rel, double margin, double m) {
  return s - margin * (m * (rel ? 0.5 : -0.5));
}

__device__ __forceinline__ double rw_units(double rank, const rw_rambo& p, double n) {
  return p.normalised ? rank / n : rank;
}

// Whether entry k (score yk) ranks ahead of entry j (score yj).
__device__ __forceinline__ bool rw_ahead(double yk, unsigned int k, double yj, unsigned int j) {
  return yk > yj || (yk == yj && k < j);
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

// Thread (q, j): rank and rank among the relevant items of j in q's shifted sequence and, for a
// relevant j of a query with norm > 0, its term of the loss (times norm).
template <typename T>
__device__ void rw_rambo_ranks(const T* s, const unsigned int* cls, const double* norm,
                               const double* mags, rw_rambo p, double* rank_out,
                               double* rank_rel_out, double* term_out, double* y_out) {
  const unsigned int q = blockIdx.x;
  const unsigned int j = blockIdx.y * blockDim.x + threadIdx.x;
  if (q >= p.b || j >= p.b || (!p.include_self && j == q)) return;
  const unsigned long long row = (unsigned long long)q * p.b;
  const unsigned int cq = cls[q];
  const auto shifted = [&](unsigned int k) {
    return rw_shifted((double)s[row + k], cls[k] == cq, p.margin,
                      p.half_normal ? mags[row + k] : 1.0);
  };
  const bool rel_j = cls[j] == cq;
  const double yj = shifted(j);
  y_out[row + j] = yj;
  // Counted in integers (exact, and cheaper than the double additions of the counts' type).
  unsigned int ahead = 0, ahead_rel = 0;
  for (unsigned int k = 0; k < p.b; ++k) {
    if (k == j || (!p.include_self && k == q)) continue;
    const bool rel_k = cls[k] == cq;
    const double yk = shifted(k);
    if (rw_ahead(yk, k, yj, j)) {
      ++ahead;
      if (rel_k) ++ahead_rel;
    }
  }
  const double rk = 1.0 + (double)ahead, rk_rel = 1.0 + (double)ahead_rel;
  rank_out[row + j] = rk;
  rank_rel_out[row + j] = rk_rel;
  const double w = norm[q];
  if (!rel_j || !(w > 0.0)) return;
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
// once per entry for the blackbox kernel, whose threads each compare against a whole sequence
// (computed there, the divisions and logarithms of g would run B times per entry). A query's
// own entry, outside its sequence unless include_self, is not written.
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

// Thread (q, j): the blackbox gradient -(rk(y) - rk(y + lambda g)) / lambda of entry j (RaMBO
// Algorithm 1), in the ranks' units, from its rank in y (rw_rambo_ranks) and the perturbed
// sequence z of rw_rambo_perturb.
template <typename T>
__device__ void rw_rambo_blackbox(rw_rambo p, const double* rank_in, const double* z_in,
                                  T* jac) {
  const unsigned int q = blockIdx.x;
  const unsigned int j = blockIdx.y * blockDim.x + threadIdx.x;
  if (q >= p.b || j >= p.b || (!p.include_self && j == q)) return;
  const unsigned long long row = (unsigned long long)q * p.b;
  const double n = p.include_self ? (double)p.b : (double)(p.b - 1);
  const double zj = z_in[row + j];
  unsigned int ahead = 0;
  for (unsigned int k = 0; k < p.b; ++k) {
    if (k == j || (!p.include_self && k == q)) continue;
    if (rw_ahead(z_in[row + k], k, zj, j)) ++ahead;
  }
  const double r = rw_units(rank_in[row + j], p, n), rl = rw_units(1.0 + (double)ahead, p, n);
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

extern "C" __global__ void rankwise_rambo_row_sums(const double* term, unsigned int b,
                                                   double* row_sum) {
  rw_rambo_row_sums(term, b, row_sum);
}

#define RW_RAMBO_KERNELS(T, SUFFIX)                                                            \
  extern "C" __global__ void rankwise_rambo_ranks_##SUFFIX(                                    \
      const T* s, const unsigned int* cls, const double* norm, const double* mags, rw_rambo p, \
      double* rank_out, double* rank_rel_out, double* term_out, double* y_out) {               \
    rw_rambo_ranks<T>(s, cls, norm, mags, p, rank_out, rank_rel_out, term_out, y_out);         \
  }                                                                                            \
  extern "C" __global__ void rankwise_rambo_perturb_##SUFFIX(                                   \
      const unsigned int* cls, const double* norm, rw_rambo p, const T* up,                    \
      const double* rank_in, const double* rank_rel_in, const double* y_in, double* z_out) {   \
    rw_rambo_perturb<T>(cls, norm, p, up, rank_in, rank_rel_in, y_in, z_out);                  \
  }                                                                                            \
  extern "C" __global__ void rankwise_rambo_blackbox_##SUFFIX(rw_rambo p, const double* rank_in, \
                                                              const double* z_in, T* jac) {    \
    rw_rambo_blackbox<T>(p, rank_in, z_in, jac);                                               \
  }                                                                                            \
  extern "C" __global__ void rankwise_rambo_total_##SUFFIX(                                    \
      const double* row_sum, unsigned int b, double memory_value, int objective, T* loss) {    \
    rw_rambo_total<T>(row_sum, b, memory_value, objective, loss);                              \
  }

RW_RAMBO_KERNELS(float, f32)
RW_RAMBO_KERNELS(double, f64)
