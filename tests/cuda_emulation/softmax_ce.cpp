// Runs the kernels of src/losses/norm_softmax/device.cu on the host, launched as
// `losses::norm_softmax::device` launches them, for the unit tests of that module.
//
// usage: softmax_ce INPUT   (stdout: the loss, the B log-sum-exps, then the B x C gradient with
//                            respect to z, as doubles)
// INPUT: u32 B, C, lanes, f32 (0/1); f64 scale; the B x C values z (f32 or f64); the B target
// columns (u32); the incoming gradient (one f32 or f64).
#include "launch.hpp"

#include "../../src/losses/norm_softmax/device.cu"

// Blocks of 5 threads (ending past the lanes, the rows and the columns: the bounds checks are
// exercised) in scrambled orders; the row kernel on two blocks, so that its threads take several
// strides.
static const unsigned int BLOCK = 5;

template <typename T, typename Parts, typename Rows, typename Total, typename Grad>
static void run(rw_input& in, unsigned int b, unsigned int c, unsigned int lanes, double scale,
                Parts parts, Rows rows, Total total, Grad grad) {
  const size_t bc = (size_t)b * c;
  std::vector<T> z = in.take<T>(bc);
  std::vector<unsigned int> target = in.take<unsigned int>(b);
  std::vector<T> g = in.take<T>(1);
  in.finish();
  // Filled with NaN: a value a kernel fails to write shows in the output.
  const double nan = std::nan("");
  std::vector<double> partial(2 * (size_t)b * lanes, nan), lse(b, nan), row_loss(b, nan);
  std::vector<T> loss(1, (T)nan), dz(bc, (T)nan);
  rw_launch_shuffled(rw_dim3{b, (lanes + BLOCK - 1) / BLOCK, 1}, rw_dim3{BLOCK, 1, 1}, 6,
                     [&] { parts(z.data(), partial.data(), b, c, lanes, scale); });
  rw_launch_shuffled(rw_dim3{2, 1, 1}, rw_dim3{BLOCK, 1, 1}, 7, [&] {
    rows(z.data(), partial.data(), target.data(), lse.data(), row_loss.data(), b, c, lanes,
         scale);
  });
  rw_launch_shuffled(rw_dim3{1, 1, 1}, rw_dim3{BLOCK, 1, 1}, 8,
                     [&] { total(row_loss.data(), loss.data(), b); });
  rw_launch_shuffled(rw_dim3{b, (c + BLOCK - 1) / BLOCK, 1}, rw_dim3{BLOCK, 1, 1}, 9, [&] {
    grad(z.data(), target.data(), lse.data(), g.data(), dz.data(), b, c, scale);
  });
  rw_write_doubles(loss);
  rw_write_doubles(lse);
  rw_write_doubles(dz);
}

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s INPUT\n", argv[0]);
    return 2;
  }
  rw_input in(argv[1]);
  std::vector<unsigned int> head = in.take<unsigned int>(4);
  const double scale = in.take<double>(1)[0];
  if (head[3])
    run<float>(in, head[0], head[1], head[2], scale, rankwise_ce_parts_f32, rankwise_ce_rows_f32,
               rankwise_ce_total_f32, rankwise_ce_grad_f32);
  else
    run<double>(in, head[0], head[1], head[2], scale, rankwise_ce_parts_f64,
                rankwise_ce_rows_f64, rankwise_ce_total_f64, rankwise_ce_grad_f64);
  return 0;
}
