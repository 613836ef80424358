// Runs the kernels of src/losses/fastap/device.cu on the host, launched as
// `losses::fastap::device` launches them, for the unit tests of that module.
//
// usage: fastap INPUT   (stdout: the B FastAP values, the B x B gradient J, the loss, then the
//                        backward pass's B x B g J, as doubles)
// INPUT: u32 B, f32 (0/1); the B x B similarities (f32 or f64); the B class ids (u32); the
// L + 1 bin centres (f64); struct rw_bins field by field; N_valid (f64); the incoming gradient g
// (one f32 or f64).
#include "launch.hpp"

#include "../../src/losses/fastap/device.cu"

// Blocks of 3 threads, so that blocks end past the rows and the bounds checks are exercised.
static const unsigned int BLOCK = 3;

template <typename T, typename Rows, typename Grad, typename Total, typename Chain>
static void run(rw_input& in, unsigned int b, Rows rows, Grad grad, Total total, Chain chain) {
  const size_t bb = (size_t)b * b;
  std::vector<T> s = in.take<T>(bb);
  std::vector<unsigned int> cls = in.take<unsigned int>(b);
  // The centres' count is in the parameters that follow them: read those from the end.
  const size_t params_len = 4 + 4 + 8 + 8 + 4 + 8;
  const size_t tail_len = params_len + sizeof(double) + sizeof(T);
  const size_t centres_len = (in.buf.size() - in.at - tail_len) / sizeof(double);
  std::vector<double> centres = in.take<double>(centres_len);
  rw_bins p;
  p.b = in.take<unsigned int>(1)[0];
  p.nb = in.take<unsigned int>(1)[0];
  p.delta = in.take<double>(1)[0];
  p.inv_delta = in.take<double>(1)[0];
  p.port = in.take<int>(1)[0];
  p.scale = in.take<double>(1)[0];
  const double valid = in.take<double>(1)[0];
  std::vector<T> g = in.take<T>(1);
  in.finish();
  if (p.b != b || p.nb != centres.size()) {
    std::fprintf(stderr, "inconsistent sizes: B %u/%u, bins %u/%zu\n", b, p.b, p.nb,
                 centres.size());
    std::exit(2);
  }
  std::vector<double> scratch(2 * b * p.nb, 0.0), fastap(b, 0.0), jac(bb, 0.0);
  const rw_dim3 block{BLOCK, 1, 1};
  rw_launch(rw_dim3{(b + BLOCK - 1) / BLOCK, 1, 1}, block, [&] {
    rows(s.data(), cls.data(), centres.data(), p, scratch.data(), fastap.data());
  });
  rw_launch(rw_dim3{b, (b + BLOCK - 1) / BLOCK, 1}, block, [&] {
    grad(s.data(), cls.data(), centres.data(), p, scratch.data(), jac.data());
  });
  // Filled with NaN: a value a kernel fails to write shows in the output.
  const double nan = std::nan("");
  std::vector<T> loss(1, (T)nan), ds(bb, (T)nan);
  rw_launch_shuffled(rw_dim3{1, 1, 1}, block, 8, [&] { total(fastap.data(), b, valid, loss.data()); });
  rw_launch_shuffled(rw_dim3{b, (b + BLOCK - 1) / BLOCK, 1}, block, 9,
                     [&] { chain(jac.data(), g.data(), ds.data(), b); });
  rw_write_doubles(fastap);
  rw_write_doubles(jac);
  rw_write_doubles(loss);
  rw_write_doubles(ds);
}

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s INPUT\n", argv[0]);
    return 2;
  }
  rw_input in(argv[1]);
  std::vector<unsigned int> head = in.take<unsigned int>(2);
  if (head[1])
    run<float>(in, head[0], rankwise_fastap_rows_f32, rankwise_fastap_grad_f32,
               rankwise_fastap_total_f32, rankwise_fastap_chain_f32);
  else
    run<double>(in, head[0], rankwise_fastap_rows_f64, rankwise_fastap_grad_f64,
                rankwise_fastap_total_f64, rankwise_fastap_chain_f64);
  return 0;
}
