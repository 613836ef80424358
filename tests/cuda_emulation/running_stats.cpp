// Runs the kernel of src/models/layers/running_stats.cu on the host, for the unit test of that
// module.
//
// usage: running_stats INPUT   (stdout: the running average after the update, as doubles)
// INPUT: u32 f32 (0/1), u64 n; the running average and the batch statistic, n values each
// (f32 or f64); keep, take and eps (f64), from_inv_std (i32).
#include "launch.hpp"

// CUDA's separately rounded operations: on the host each operator rounds on its own (ISO C++
// does not contract a product and a sum; x86-64 computes floats in SSE registers).
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline double __dmul_rn(double a, double b) { return a * b; }
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline double __dadd_rn(double a, double b) { return a + b; }
static inline float __fdiv_rn(float a, float b) { return a / b; }
static inline double __ddiv_rn(double a, double b) { return a / b; }

#include "../../src/models/layers/running_stats.cu"

template <typename T>
static void run(rw_input& in, unsigned long long n) {
  std::vector<T> running = in.take<T>(n), batch = in.take<T>(n);
  rw_ema p;
  p.n = n;
  p.keep = in.take<double>(1)[0];
  p.take = in.take<double>(1)[0];
  p.eps = in.take<double>(1)[0];
  p.from_inv_std = in.take<int>(1)[0];
  p.pad = 0;
  in.finish();
  // Two blocks of 3 threads: every thread takes several strides of the grid-stride loop.
  rw_launch(rw_dim3{2, 1, 1}, rw_dim3{3, 1, 1},
            [&] { rw_ema_update<T>(running.data(), batch.data(), p); });
  rw_write_doubles(running);
}

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s INPUT\n", argv[0]);
    return 2;
  }
  rw_input in(argv[1]);
  const unsigned int f32 = in.take<unsigned int>(1)[0];
  const unsigned long long n = in.take<unsigned long long>(1)[0];
  if (f32)
    run<float>(in, n);
  else
    run<double>(in, n);
  return 0;
}
