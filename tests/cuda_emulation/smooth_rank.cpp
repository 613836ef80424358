// Runs the kernels of src/losses/smooth_rank/device.cu on the host, launched as
// `losses::smooth_rank::device` launches them, for the unit tests of that module.
//
// usage: smooth_rank INPUT   (stdout: Q APs, then the Q x N Jacobian, as little-endian doubles)
// INPUT: u32 Q, N, L, f32 (0/1), P (the positives of all queries); the Q x N scores (f32 or
// f64); the Q x N levels (u8); the positive lists (u32): Q + 1 offsets, P queries, P items; the
// Q x (L + 1) relevances and the 6 x RW_SLOT_LEN surrogate pieces (f64).
#include "launch.hpp"

#include "../../src/losses/smooth_rank/device.cu"

// A block of 7 threads, so that blocks end past the rows and the bounds checks are exercised.
static const unsigned int BLOCK = 7;

template <typename T, typename P1, typename P2, typename V>
static void run(rw_input& in, unsigned int q, unsigned int n, unsigned int nl, unsigned int np,
                P1 pass1, P2 pass2, V values_fn) {
  const size_t qn = (size_t)q * n;
  std::vector<T> scores = in.take<T>(qn);
  std::vector<unsigned char> levels = in.take<unsigned char>(qn);
  std::vector<unsigned int> pos_start = in.take<unsigned int>((size_t)q + 1);
  std::vector<unsigned int> pos_query = in.take<unsigned int>(np);
  std::vector<unsigned int> pos_item = in.take<unsigned int>(np);
  std::vector<double> rel = in.take<double>((size_t)q * (nl + 1));
  std::vector<double> pieces = in.take<double>(6 * RW_SLOT_LEN);
  in.finish();
  // NaN everywhere first: the device allocates these without zeroing them, so every value the
  // kernels leave unwritten would show.
  std::vector<double> rank(np, NAN), hrank(np, NAN), own(np, NAN);
  std::vector<T> jac(qn, (T)NAN), values(q, (T)NAN);
  const rw_dim3 rows{q, (n + BLOCK - 1) / BLOCK, 1}, block{BLOCK, 1, 1};
  // As the Rust side: no pass 1 launch when no query has a positive.
  if (np > 0)
    rw_launch(rw_dim3{(np + BLOCK - 1) / BLOCK, 1, 1}, block, [&] {
      pass1(scores.data(), levels.data(), rel.data(), pieces.data(), pos_query.data(),
            pos_item.data(), np, n, nl, rank.data(), hrank.data(), own.data());
    });
  rw_launch(rows, block, [&] {
    pass2(scores.data(), levels.data(), rel.data(), pieces.data(), pos_start.data(),
          pos_item.data(), q, n, nl, rank.data(), hrank.data(), own.data(), jac.data());
  });
  rw_launch(rw_dim3{(q + BLOCK - 1) / BLOCK, 1, 1}, block, [&] {
    values_fn(levels.data(), rel.data(), pos_start.data(), pos_item.data(), q, n, nl,
              rank.data(), hrank.data(), values.data());
  });
  rw_write_doubles(values);
  rw_write_doubles(jac);
}

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s INPUT\n", argv[0]);
    return 2;
  }
  rw_input in(argv[1]);
  std::vector<unsigned int> head = in.take<unsigned int>(5);
  if (head[3])
    run<float>(in, head[0], head[1], head[2], head[4], rankwise_smooth_rank_pass1_f32,
               rankwise_smooth_rank_pass2_f32, rankwise_smooth_rank_values_f32);
  else
    run<double>(in, head[0], head[1], head[2], head[4], rankwise_smooth_rank_pass1_f64,
                rankwise_smooth_rank_pass2_f64, rankwise_smooth_rank_values_f64);
  return 0;
}
