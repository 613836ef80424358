// Each query's positives placed in its full ranking, on a CUDA device, for the evaluation engine,
// and each query's top-k candidates, for the kNN (`retrieval::device_rank`, whose module
// documentation gives the method). Compiled at run time by NVRTC (no include, no host code), and
// on the host by the emulation tests of that module.
//
// A chunk of `rows` queries (global indices start..start + rows) against `nr` references:
// scores: rows x nr, row-major, larger = ranked first; ref: the references' label columns,
// coarsest first (levels x nr); query: the chunk's queries' labels, coarsest first (rows x
// levels); offsets: rows + 1 prefix sums of each query's number of positives (counted on the
// host with the same level rule). A positive is a reference whose level of match is at least
// min_level (>= 1: the lowest level the evaluation's metrics read; the rest count as negatives,
// which moves no metric that reads only those levels); the query itself (reference start + row,
// when same_index) is left out of its list. The ranking is the host engine's: decreasing score,
// ties by increasing reference index (`retrieval::order`).

struct rw_rank {
  unsigned int rows;
  unsigned int nr;
  unsigned int levels;  // label columns
  unsigned int min_level;  // a positive's lowest level of match (>= 1)
  unsigned int start;   // global index of the chunk's first query
  int same_index;       // reference start + row is query row itself: left out
};

// The host's `order::descending_key`: unsigned order = decreasing float order, -0.0 ties +0.0.
__device__ __forceinline__ unsigned int rw_descending_key(float score) {
  unsigned int bits = __float_as_uint(score);
  if (bits == 0x80000000u) bits = 0u;  // -0.0 and +0.0 compare equal, so they tie
  const unsigned int ascending = (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
  return ~ascending;
}

// The host's `order::rank_key`: ascending order = the ranking (score, then index).
__device__ __forceinline__ unsigned long long rw_rank_key(float score, unsigned int j) {
  return ((unsigned long long)rw_descending_key(score) << 32) | (unsigned long long)j;
}

// The host's `ReferenceLevels::level`: label columns matched from the coarsest, up to the first
// mismatch.
__device__ __forceinline__ unsigned int rw_level(const long long* ref, unsigned int nr,
                                                 const long long* q, unsigned int levels,
                                                 unsigned int j) {
  unsigned int level = 0;
  for (unsigned int c = 0; c < levels; ++c) {
    if (ref[(size_t)c * nr + j] != q[c]) break;
    ++level;
  }
  return level;
}

// Thread (row, j): reference j's level for the row's query; a positive's rank key and level are
// put in one of the row's slots (offsets[row]..offsets[row + 1]), in whatever order the atomic
// counter hands them out (the next kernel orders them). fill[row] ends at the row's number of
// positives, which the host compares with its own count.
extern "C" __global__ void rankwise_rank_gather(const float* scores, const long long* ref,
                                                const long long* query,
                                                const unsigned int* offsets, rw_rank p,
                                                unsigned int* fill, unsigned long long* keys,
                                                unsigned char* levels_out) {
  const unsigned int row = blockIdx.x;
  const unsigned int j = blockIdx.y * blockDim.x + threadIdx.x;
  if (row >= p.rows || j >= p.nr) return;
  if (p.same_index && j == p.start + row) return;
  const unsigned int level = rw_level(ref, p.nr, query + (size_t)row * p.levels, p.levels, j);
  if (level < p.min_level) return;
  const unsigned int slot = offsets[row] + atomicAdd(&fill[row], 1u);
  // More positives than the host counted: the host sees it in fill and errors; no write out of
  // the row's slots.
  if (slot >= offsets[row + 1]) return;
  keys[slot] = rw_rank_key(scores[(size_t)row * p.nr + j], j);
  levels_out[slot] = (unsigned char)level;
}

// One pass of a merge sort of each row's positives by key, from runs of `width` sorted keys
// (width 1: the gathered order) to runs of 2 width. Thread (row, k): the k-th key, in run
// r = k / width, goes to its place in the merge of run r with its sibling (r xor 1): its index
// in its own run plus the number of the sibling's keys that are smaller (binary search; keys
// are distinct, as they contain the index, so the places are a permutation). ceil(log2 P)
// passes sort a row of P; a row sorted already (one run) is copied. O(P log P) per pass.
extern "C" __global__ void rankwise_rank_merge(const unsigned int* offsets, rw_rank p,
                                               unsigned int width,
                                               const unsigned long long* keys,
                                               const unsigned char* levels,
                                               unsigned long long* merged_keys,
                                               unsigned char* merged_levels) {
  const unsigned int row = blockIdx.x;
  const unsigned int k = blockIdx.y * blockDim.x + threadIdx.x;
  if (row >= p.rows) return;
  const unsigned int begin = offsets[row];
  const unsigned int n = offsets[row + 1] - begin;
  if (k >= n) return;
  const unsigned int run = k / width;
  const unsigned int own_start = run * width;
  const unsigned int pair_start = (run & ~1u) * width;
  // The sibling run: the next one for an even run, the previous one for an odd run; empty past
  // the row's end.
  const unsigned int sib_start = (run & 1u) ? own_start - width : own_start + width;
  unsigned int sib_len = 0;
  if (sib_start < n) sib_len = (n - sib_start < width) ? n - sib_start : width;
  const unsigned long long mine = keys[begin + k];
  unsigned int lo = 0, hi = sib_len;
  while (lo < hi) {
    const unsigned int mid = lo + (hi - lo) / 2;
    if (keys[begin + sib_start + mid] < mine)
      lo = mid + 1;
    else
      hi = mid;
  }
  const unsigned int place = pair_start + (k - own_start) + lo;
  merged_keys[begin + place] = mine;
  merged_levels[begin + place] = levels[begin + k];
}

// Thread (row, j): a negative j (level below min_level, not the query itself) finds, by binary
// search among the row's sorted positives, how many positives rank before it (b), and counts in
// gaps[begin + b] (the negatives between positive b - 1 and positive b). A negative after every
// positive is not counted (it moves no positive).
extern "C" __global__ void rankwise_rank_count(const float* scores, const long long* ref,
                                               const long long* query,
                                               const unsigned int* offsets, rw_rank p,
                                               const unsigned long long* sorted_keys,
                                               unsigned int* gaps) {
  const unsigned int row = blockIdx.x;
  const unsigned int j = blockIdx.y * blockDim.x + threadIdx.x;
  if (row >= p.rows || j >= p.nr) return;
  if (p.same_index && j == p.start + row) return;
  if (rw_level(ref, p.nr, query + (size_t)row * p.levels, p.levels, j) >= p.min_level) return;
  const unsigned int begin = offsets[row];
  const unsigned int n = offsets[row + 1] - begin;
  const unsigned long long key = rw_rank_key(scores[(size_t)row * p.nr + j], j);
  unsigned int lo = 0, hi = n;
  while (lo < hi) {
    const unsigned int mid = lo + (hi - lo) / 2;
    if (sorted_keys[begin + mid] < key)
      lo = mid + 1;
    else
      hi = mid;
  }
  if (lo < n) atomicAdd(&gaps[begin + lo], 1u);
}

// Thread row: positive k's position in the row's ranking = the k positives before it + the
// negatives before it (the gaps up to its own, a running sum).
extern "C" __global__ void rankwise_rank_positions(const unsigned int* offsets, rw_rank p,
                                                   const unsigned int* gaps,
                                                   unsigned int* positions) {
  const unsigned int row = blockIdx.x * blockDim.x + threadIdx.x;
  if (row >= p.rows) return;
  const unsigned int begin = offsets[row];
  const unsigned int n = offsets[row + 1] - begin;
  unsigned int negatives = 0;
  for (unsigned int k = 0; k < n; ++k) {
    negatives += gaps[begin + k];
    positions[begin + k] = k + negatives;
  }
}

// The top-k candidates of each query (`retrieval::knn` on a device): thread (row, j) keeps
// reference j if its score is at least the row's threshold (a sampled estimate, made on the
// host as the host's kNN makes it), putting its rank key in one of the row's `cap` slots, in
// whatever order the atomic counter hands them out (the host selects and sorts them). fill[row]
// ends at the number of references that passed, which may exceed cap: the host then ranks that
// row from its scores.
struct rw_knn {
  unsigned int rows;
  unsigned int nr;
  unsigned int cap;    // slots per row
  unsigned int start;  // global index of the chunk's first query
  int same_index;      // reference start + row is query row itself: left out
};

extern "C" __global__ void rankwise_knn_gather(const float* scores, const float* thresholds,
                                               rw_knn p, unsigned int* fill,
                                               unsigned long long* keys) {
  const unsigned int row = blockIdx.x;
  const unsigned int j = blockIdx.y * blockDim.x + threadIdx.x;
  if (row >= p.rows || j >= p.nr) return;
  if (p.same_index && j == p.start + row) return;
  const float score = scores[(size_t)row * p.nr + j];
  if (!(score >= thresholds[row])) return;
  const unsigned int slot = atomicAdd(&fill[row], 1u);
  if (slot < p.cap) keys[(size_t)row * p.cap + slot] = rw_rank_key(score, j);
}
