// Runs the kernels of src/losses/guard/device.cu on the host, for the unit test of that module.
//
// usage: guard INPUT   (stdout: the f32 flag after the finiteness check, then after the norm
//                       check, as doubles)
// INPUT: u32 f32 (0/1), u64 n; the n values (f32 or f64).
#include "launch.hpp"

#include "../../src/losses/guard/device.cu"

template <typename T>
static void run(rw_input& in, unsigned long long n) {
  std::vector<T> x = in.take<T>(n);
  in.finish();
  std::vector<float> finite(1, 0.0f), norm(1, 0.0f);
  const float nan = NAN;
  // Two blocks of 3 threads, in a scrambled order: every thread takes several strides.
  const rw_dim3 grid{2, 1, 1}, block{3, 1, 1};
  rw_launch_shuffled(grid, block, 7, [&] { rw_guard_finite<T>(x.data(), n, nan, finite.data()); });
  rw_launch_shuffled(grid, block, 8, [&] { rw_guard_norm<T>(x.data(), n, nan, norm.data()); });
  rw_write_doubles(finite);
  rw_write_doubles(norm);
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
