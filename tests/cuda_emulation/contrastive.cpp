// Runs the kernels of src/losses/contrastive/device.cu on the host, launched as
// `losses::contrastive::device` launches them, for the unit tests of that module.
//
// usage: contrastive INPUT   (stdout: the loss, the two divisors, then the B x B gradient with
//                             respect to s, as doubles)
// INPUT: u32 B, f32 (0/1), euclidean (0/1), mean (0/1); f64 pos_margin, neg_margin; the B x B
// similarities (f32 or f64); the B class ids (u32); the incoming gradient (one f32 or f64).
#include "launch.hpp"

#include "../../src/losses/contrastive/device.cu"

// Blocks of 5 threads (ending past the rows and columns: the bounds checks are exercised) in
// scrambled orders; the row kernel on two blocks, so that its threads take several strides.
static const unsigned int BLOCK = 5;

template <typename T, typename Rows, typename Total, typename Grad>
static void run(rw_input& in, unsigned int b, unsigned int euclidean, unsigned int mean,
                double pm, double nm, Rows rows, Total total, Grad grad) {
  const size_t bb = (size_t)b * b;
  std::vector<T> s = in.take<T>(bb);
  std::vector<unsigned int> cls = in.take<unsigned int>(b);
  std::vector<T> g = in.take<T>(1);
  in.finish();
  std::vector<double> partial(6 * (size_t)b, -1.0), divisors(2, -1.0);
  std::vector<T> loss(1, (T)-1), ds(bb, (T)-1);
  rw_launch_shuffled(rw_dim3{2, 1, 1}, rw_dim3{BLOCK, 1, 1}, 7, [&] {
    rows(s.data(), cls.data(), partial.data(), b, pm, nm, euclidean);
  });
  rw_launch_shuffled(rw_dim3{1, 1, 1}, rw_dim3{BLOCK, 1, 1}, 8,
                     [&] { total(partial.data(), loss.data(), divisors.data(), b, mean); });
  rw_launch_shuffled(rw_dim3{b, (b + BLOCK - 1) / BLOCK, 1}, rw_dim3{BLOCK, 1, 1}, 9, [&] {
    grad(s.data(), cls.data(), divisors.data(), g.data(), ds.data(), b, pm, nm, euclidean);
  });
  rw_write_doubles(loss);
  rw_write_doubles(divisors);
  rw_write_doubles(ds);
}

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s INPUT\n", argv[0]);
    return 2;
  }
  rw_input in(argv[1]);
  std::vector<unsigned int> head = in.take<unsigned int>(4);
  std::vector<double> margins = in.take<double>(2);
  if (head[1])
    run<float>(in, head[0], head[2], head[3], margins[0], margins[1], rankwise_pair_rows_f32,
               rankwise_pair_total_f32, rankwise_pair_grad_f32);
  else
    run<double>(in, head[0], head[2], head[3], margins[0], margins[1], rankwise_pair_rows_f64,
                rankwise_pair_total_f64, rankwise_pair_grad_f64);
  return 0;
}
