// Runs the kernels of src/models/layers/relu.cu on the host, for the unit test of that module.
//
// usage: relu INPUT   (stdout: relu(a), relu(a + b), and the gradient a where b > 0, as doubles)
// INPUT: u32 f32 (0/1), u64 n; a and b, n values each (f32 or f64).
#include "launch.hpp"

#include "../../src/models/layers/relu.cu"

template <typename T>
static void run(rw_input& in, unsigned long long n) {
  std::vector<T> a = in.take<T>(n), b = in.take<T>(n);
  in.finish();
  std::vector<T> relu(n), sum(n), grad(n);
  // Two blocks of 3 threads: every thread takes several strides of the grid-stride loops.
  const rw_dim3 grid{2, 1, 1}, block{3, 1, 1};
  rw_launch(grid, block, [&] { rw_relu<T>(a.data(), relu.data(), n); });
  rw_launch(grid, block, [&] { rw_add_relu<T>(a.data(), b.data(), sum.data(), n); });
  // The gradient kernel reads b as the ReLU's output and a as the incoming gradient.
  rw_launch(grid, block, [&] { rw_relu_grad<T>(b.data(), a.data(), grad.data(), n); });
  rw_write_doubles(relu);
  rw_write_doubles(sum);
  rw_write_doubles(grad);
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
