// The smooth-rank AP of `losses::smooth_rank` on a CUDA device, one thread per (query, positive),
// then one per (query, item): the module documentation of `device.rs` beside this file gives the
// formulas. Compiled at run time by NVRTC (no include, no host code), and on the host by the
// emulation test of that module, which defines `__global__`, `__device__`, the launch indices and
// the math functions.
//
// The pieces of each of the six surrogates (rank: lower, equal, higher; H-rank: the same) come
// as `RW_SLOT_LEN` doubles: the number of pieces, then per piece
// [upper kind (0: t < b, 1: t <= b, 2: unbounded), b, function (0: constant a,
//  1: a (t - b') + c, 2: sigmoid(t / a) + b), then its three parameters].
// Everything is accumulated in double, as the host engine does; the sigmoid's exponential is
// evaluated in the scores' type.

#define RW_EXCLUDED 255
#define RW_MAX_PIECES 6
#define RW_PIECE_LEN 6
#define RW_SLOT_LEN (1 + RW_MAX_PIECES * RW_PIECE_LEN)

template <typename T> __device__ __forceinline__ double rw_exp(double x);
template <> __device__ __forceinline__ double rw_exp<float>(double x) {
  return (double)expf((float)x);
}
template <> __device__ __forceinline__ double rw_exp<double>(double x) { return exp(x); }

// Value and derivative at `t` of the surrogate whose pieces are in `slot`.
template <typename T>
__device__ __forceinline__ void rw_surrogate(const double* slot, double t, double* v, double* d) {
  const int count = (int)slot[0];
  for (int i = 0; i < count; ++i) {
    const double* p = slot + 1 + i * RW_PIECE_LEN;
    const int upper = (int)p[0];
    const bool inside = upper == 2 || (upper == 0 ? t < p[1] : t <= p[1]);
    if (!inside) continue;
    const int f = (int)p[2];
    if (f == 0) {
      *v = p[3];
      *d = 0.0;
    } else if (f == 1) {
      *v = p[3] * (t - p[4]) + p[5];
      *d = p[3];
    } else {
      // The host's `sigmoid_value_derivative`: d = s^2 e / tau keeps its precision near s = 1.
      const double e = rw_exp<T>(t * (-1.0 / p[3]));
      const double s = 1.0 / (e + 1.0);
      *v = s + p[4];
      *d = s * s * e / p[3];
    }
    return;
  }
  // Unreachable: the last piece of every surrogate is unbounded.
  *v = nan("");
  *d = nan("");
}

// Which surrogate a pair uses: the level of `j` against the level of the positive `k`.
__device__ __forceinline__ int rw_category(unsigned char lj, unsigned char lk) {
  return lj < lk ? 0 : (lj == lk ? 1 : 2);
}

// The positives of every query, listed on the host: query q's are the items
// pos_item[pos_start[q] .. pos_start[q + 1]] (level >= 1, in the retrieval set), in increasing
// order, and entry e belongs to the query pos_query[e]. A thread then visits only the pairs that
// enter the formulas: O(P N) per query, P its positives, where a thread per item scanning every
// item was O(N^2) with most threads idle (a batch of m images per class has P = m - 1).

// Pass 1, thread e (an entry of the lists): for the positive k = pos_item[e] of the query
// q = pos_query[e], rank(k), H-rank(k) and the derivative of H-rank(k) / rank(k) with respect to
// s_k itself (G), at entry e of the outputs.
template <typename T>
__device__ void rw_pass1(const T* scores, const unsigned char* levels, const double* rel,
                         const double* pieces, const unsigned int* pos_query,
                         const unsigned int* pos_item, unsigned int n_pos, unsigned int n,
                         unsigned int nl, double* rank_out, double* hrank_out, double* self_out) {
  const unsigned int e = blockIdx.x * blockDim.x + threadIdx.x;
  if (e >= n_pos) return;
  const unsigned int q = pos_query[e];
  const unsigned int k = pos_item[e];
  const unsigned long long row = (unsigned long long)q * n;
  const T* s = scores + row;
  const unsigned char* lv = levels + row;
  const double* r = rel + (unsigned long long)q * (nl + 1);
  const unsigned char lk = lv[k];
  const double sk = (double)s[k];
  const double rk = r[lk];
  double rank = 1.0, hrank = rk, drank = 0.0, dhrank = 0.0;
  for (unsigned int j = 0; j < n; ++j) {
    const unsigned char lj = lv[j];
    if (j == k || lj == RW_EXCLUDED) continue;
    const int cat = rw_category(lj, lk);
    const double t = (double)s[j] - sk;
    double v, d;
    rw_surrogate<T>(pieces + cat * RW_SLOT_LEN, t, &v, &d);
    rank += v;
    drank += d;
    if (lj >= 1) {
      const double w = fmin(rk, r[lj]);
      rw_surrogate<T>(pieces + (3 + cat) * RW_SLOT_LEN, t, &v, &d);
      hrank += w * v;
      dhrank += w * d;
    }
  }
  rank_out[e] = rank;
  hrank_out[e] = hrank;
  // t = s_j - s_k, so d/ds_k of each sum is minus the sum of the derivatives.
  self_out[e] = -dhrank / rank + hrank * drank / (rank * rank);
}

// Pass 2, thread (q, j): the derivative of the query's AP with respect to s_j,
// (1/Z) [sum over positives k != j of d(H-rank(k)/rank(k))/ds_j, plus G(j) if j is a positive],
// Z the sum of the relevances of the positives (0 when Z is not > 0). The positives are visited
// in increasing order, so the sums are those of a scan of every item that skips the others.
template <typename T>
__device__ void rw_pass2(const T* scores, const unsigned char* levels, const double* rel,
                         const double* pieces, const unsigned int* pos_start,
                         const unsigned int* pos_item, unsigned int nq, unsigned int n,
                         unsigned int nl, const double* rank_in, const double* hrank_in,
                         const double* self_in, T* jac) {
  const unsigned int q = blockIdx.x;
  const unsigned int j = blockIdx.y * blockDim.x + threadIdx.x;
  if (q >= nq || j >= n) return;
  const unsigned long long row = (unsigned long long)q * n;
  const T* s = scores + row;
  const unsigned char* lv = levels + row;
  const double* r = rel + (unsigned long long)q * (nl + 1);
  const unsigned char lj = lv[j];
  const double sj = (double)s[j];
  double z = 0.0, acc = 0.0, own = 0.0;
  const unsigned int end = pos_start[q + 1];
  for (unsigned int e = pos_start[q]; e < end; ++e) {
    const unsigned int k = pos_item[e];
    const unsigned char lk = lv[k];
    z += r[lk];
    if (k == j) {
      own = self_in[e];
      continue;
    }
    if (lj == RW_EXCLUDED) continue;
    const int cat = rw_category(lj, lk);
    const double t = sj - (double)s[k];
    const double rank = rank_in[e];
    double v, d;
    rw_surrogate<T>(pieces + cat * RW_SLOT_LEN, t, &v, &d);
    acc -= hrank_in[e] * d / (rank * rank);
    if (lj >= 1) {
      const double w = fmin(r[lk], r[lj]);
      rw_surrogate<T>(pieces + (3 + cat) * RW_SLOT_LEN, t, &v, &d);
      acc += w * d / rank;
    }
  }
  if (lj != RW_EXCLUDED && lj >= 1) acc += own;
  jac[row + j] = (T)(z > 0.0 ? acc / z : 0.0);
}

// Thread q: the query's AP, sum over its positives of H-rank / rank, over Z (0 when Z is not
// > 0: no positive).
template <typename T>
__device__ void rw_values(const unsigned char* levels, const double* rel,
                          const unsigned int* pos_start, const unsigned int* pos_item,
                          unsigned int nq, unsigned int n, unsigned int nl, const double* rank_in,
                          const double* hrank_in, T* values) {
  const unsigned int q = blockIdx.x * blockDim.x + threadIdx.x;
  if (q >= nq) return;
  const unsigned char* lv = levels + (unsigned long long)q * n;
  const double* r = rel + (unsigned long long)q * (nl + 1);
  double z = 0.0, total = 0.0;
  const unsigned int end = pos_start[q + 1];
  for (unsigned int e = pos_start[q]; e < end; ++e) {
    z += r[lv[pos_item[e]]];
    total += hrank_in[e] / rank_in[e];
  }
  values[q] = (T)(z > 0.0 ? total / z : 0.0);
}

// The loss 1 - mean AP over the valid queries (those with a positive), by one thread: the valid
// queries' APs summed in query order, in double, over their number.
template <typename T>
__device__ void rw_mean_loss(const T* ap, const unsigned char* valid, unsigned int nq,
                             double n_valid, T* loss) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  double sum = 0.0;
  for (unsigned int q = 0; q < nq; ++q)
    if (valid[q]) sum += (double)ap[q];
  *loss = (T)(1.0 - sum / n_valid);
}

// Its gradient, one thread per query (grid-stride): -g / n_valid for a valid query, 0 for the
// others; g the loss's incoming gradient, read on the device.
template <typename T>
__device__ void rw_mean_loss_grad(const unsigned char* valid, const T* g, T* dap,
                                  unsigned int nq, double n_valid) {
  const unsigned int first = blockIdx.x * blockDim.x + threadIdx.x;
  const unsigned int stride = gridDim.x * blockDim.x;
  for (unsigned int q = first; q < nq; q += stride)
    dap[q] = valid[q] ? (T)(-(double)g[0] / n_valid) : (T)0;
}

#define RW_KERNELS(T, SUFFIX)                                                                  \
  extern "C" __global__ void rankwise_smooth_rank_pass1_##SUFFIX(                              \
      const T* scores, const unsigned char* levels, const double* rel, const double* pieces,   \
      const unsigned int* pos_query, const unsigned int* pos_item, unsigned int n_pos,         \
      unsigned int n, unsigned int nl, double* rank_out, double* hrank_out, double* self_out) { \
    rw_pass1<T>(scores, levels, rel, pieces, pos_query, pos_item, n_pos, n, nl, rank_out,      \
                hrank_out, self_out);                                                          \
  }                                                                                            \
  extern "C" __global__ void rankwise_smooth_rank_pass2_##SUFFIX(                              \
      const T* scores, const unsigned char* levels, const double* rel, const double* pieces,   \
      const unsigned int* pos_start, const unsigned int* pos_item, unsigned int nq,            \
      unsigned int n, unsigned int nl, const double* rank_in, const double* hrank_in,          \
      const double* self_in, T* jac) {                                                         \
    rw_pass2<T>(scores, levels, rel, pieces, pos_start, pos_item, nq, n, nl, rank_in,          \
                hrank_in, self_in, jac);                                                       \
  }                                                                                            \
  extern "C" __global__ void rankwise_smooth_rank_values_##SUFFIX(                             \
      const unsigned char* levels, const double* rel, const unsigned int* pos_start,           \
      const unsigned int* pos_item, unsigned int nq, unsigned int n, unsigned int nl,          \
      const double* rank_in, const double* hrank_in, T* values) {                              \
    rw_values<T>(levels, rel, pos_start, pos_item, nq, n, nl, rank_in, hrank_in, values);     \
  }                                                                                            \
  extern "C" __global__ void rankwise_smooth_rank_mean_##SUFFIX(                               \
      const T* ap, const unsigned char* valid, unsigned int nq, double n_valid, T* loss) {      \
    rw_mean_loss<T>(ap, valid, nq, n_valid, loss);                                             \
  }                                                                                            \
  extern "C" __global__ void rankwise_smooth_rank_mean_grad_##SUFFIX(                          \
      const unsigned char* valid, const T* g, T* dap, unsigned int nq, double n_valid) {       \
    rw_mean_loss_grad<T>(valid, g, dap, nq, n_valid);                                          \
  }

RW_KERNELS(float, f32)
RW_KERNELS(double, f64)
