// Runs the kernels of src/losses/normalize/device.cu on the host, for the unit test of that
// module.
//
// usage: normalize INPUT   (stdout: y = x / n, then the gradient dx from y, n and g, as doubles)
// INPUT: u32 f32 (0/1), u64 rows, u64 d; x (rows × d), n (rows), g (rows × d) (f32 or f64).
#include "launch.hpp"

#include "../../src/losses/normalize/device.cu"

template <typename T>
static void run(rw_input& in, unsigned long long rows, unsigned long long d) {
  std::vector<T> x = in.take<T>(rows * d), n = in.take<T>(rows), g = in.take<T>(rows * d);
  in.finish();
  std::vector<T> y(rows * d), dx(rows * d);
  // Two blocks of 3 threads, in a scrambled order: every thread takes several strides.
  const rw_dim3 grid{2, 1, 1}, block{3, 1, 1};
  rw_launch_shuffled(grid, block, 5, [&] { rw_unit_rows<T>(x.data(), n.data(), y.data(), rows, d); });
  rw_launch_shuffled(grid, block, 6, [&] {
    rw_unit_rows_grad<T>(y.data(), n.data(), g.data(), dx.data(), rows, d);
  });
  rw_write_doubles(y);
  rw_write_doubles(dx);
}

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s INPUT\n", argv[0]);
    return 2;
  }
  rw_input in(argv[1]);
  const unsigned int f32 = in.take<unsigned int>(1)[0];
  const unsigned long long rows = in.take<unsigned long long>(1)[0];
  const unsigned long long d = in.take<unsigned long long>(1)[0];
  if (f32)
    run<float>(in, rows, d);
  else
    run<double>(in, rows, d);
  return 0;
}
