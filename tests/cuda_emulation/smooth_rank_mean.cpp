// Runs the mean-loss kernels of src/losses/smooth_rank/device.cu on the host, launched as
// `losses::smooth_rank::device::mean_loss` launches them, for the unit tests of that module.
//
// usage: smooth_rank_mean INPUT   (stdout: the loss, then the Q gradients, as doubles)
// INPUT: u32 Q, f32 (0/1); f64 the number of valid queries; the Q APs (f32 or f64); the Q
// validity flags (u8); the incoming gradient (one f32 or f64).
#include "launch.hpp"

#include "../../src/losses/smooth_rank/device.cu"

// Blocks of 3 threads on two blocks, in scrambled orders: the gradient's threads take several
// strides.
static const unsigned int BLOCK = 3;

template <typename T, typename Mean, typename Grad>
static void run(rw_input& in, unsigned int q, Mean mean, Grad grad) {
  const double n_valid = in.take<double>(1)[0];
  std::vector<T> ap = in.take<T>(q);
  std::vector<unsigned char> valid = in.take<unsigned char>(q);
  std::vector<T> g = in.take<T>(1);
  in.finish();
  std::vector<T> loss(1, (T)NAN), dap(q, (T)NAN);
  const rw_dim3 block{BLOCK, 1, 1};
  rw_launch_shuffled(rw_dim3{1, 1, 1}, block, 5,
                     [&] { mean(ap.data(), valid.data(), q, n_valid, loss.data()); });
  rw_launch_shuffled(rw_dim3{2, 1, 1}, block, 6,
                     [&] { grad(valid.data(), g.data(), dap.data(), q, n_valid); });
  rw_write_doubles(loss);
  rw_write_doubles(dap);
}

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s INPUT\n", argv[0]);
    return 2;
  }
  rw_input in(argv[1]);
  std::vector<unsigned int> head = in.take<unsigned int>(2);
  if (head[1])
    run<float>(in, head[0], rankwise_smooth_rank_mean_f32, rankwise_smooth_rank_mean_grad_f32);
  else
    run<double>(in, head[0], rankwise_smooth_rank_mean_f64, rankwise_smooth_rank_mean_grad_f64);
  return 0;
}
