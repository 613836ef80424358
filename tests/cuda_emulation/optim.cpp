// Runs the kernels of src/train/optim/device.cu on the host, in the order in which
// `train::optim::device` launches them, for the unit tests of that module. Adam's multi-tensor
// kernel gets the n values as three tensors (the device's table of addresses and blocks of
// `chunk` values, in a scrambled order).
//
// usage: optim INPUT   (stdout: theta, then the two buffers after the update, as doubles)
// INPUT: u32 kind (0 Adam, 1 SGD), u32 f32 (0/1), u64 n; theta, the gradient and the two
// buffers (m and v for Adam, the momentum buffer and an unused one for SGD), n values each
// (f32 or f64); struct rw_adam or rw_sgd field by field.
#include "launch.hpp"

// CUDA's separately rounded operations: on the host, each operator rounds on its own (ISO C++
// does not contract a product and a sum, and x86-64 computes floats in SSE registers).
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline double __dmul_rn(double a, double b) { return a * b; }
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline double __dadd_rn(double a, double b) { return a + b; }
static inline float __fsub_rn(float a, float b) { return a - b; }
static inline double __dsub_rn(double a, double b) { return a - b; }
static inline float __fdiv_rn(float a, float b) { return a / b; }
static inline double __ddiv_rn(double a, double b) { return a / b; }
static inline float __fsqrt_rn(float a) { return std::sqrt(a); }
static inline double __dsqrt_rn(double a) { return std::sqrt(a); }

#include "../../src/train/optim/device.cu"

// Two blocks of 3 threads: fewer threads than values, so that every thread takes several
// strides of the grid-stride loops (the device launches one thread per value).
static const rw_dim3 GRID{2, 1, 1}, BLOCK{3, 1, 1};

template <typename P>
static P take_params(rw_input& in) {
  std::vector<unsigned char> raw = in.take<unsigned char>(sizeof(P));
  P p;
  std::memcpy(&p, raw.data(), sizeof(P));
  return p;
}

template <typename T>
static void run(rw_input& in, unsigned int kind, unsigned long long n) {
  std::vector<T> theta = in.take<T>(n), g = in.take<T>(n), b0 = in.take<T>(n), b1 = in.take<T>(n);
  if (kind == 0) {
    rw_adam p = take_params<rw_adam>(in);
    in.finish();
    if (p.n != n) std::exit(3);
    // Three tensors of about n / 3 values; blocks of 4 values, one more than a block's
    // threads, so that a thread takes two strides and blocks end inside and past a tensor.
    const unsigned long long chunk = 4, third = n / 3;
    const unsigned long long starts[3] = {0, third, 2 * third}, ends[3] = {third, 2 * third, n};
    std::vector<rw_adam_tensor> tensors;
    std::vector<rw_adam_block> blocks;
    for (int k = 0; k < 3; ++k) {
      rw_adam_tensor e;
      const unsigned long long at = starts[k];
      e.theta = (unsigned long long)(theta.data() + at);
      e.g = (unsigned long long)(g.data() + at);
      e.m = (unsigned long long)(b0.data() + at);
      e.v = (unsigned long long)(b1.data() + at);
      e.p = p;
      e.p.n = ends[k] - at;
      for (unsigned long long s = 0; s < e.p.n; s += chunk) blocks.push_back({(unsigned long long)k, s});
      tensors.push_back(e);
    }
    rw_launch_shuffled(rw_dim3{(unsigned int)blocks.size(), 1, 1}, BLOCK, 5,
                       [&] { rw_adam_many<T>(tensors.data(), blocks.data(), chunk); });
  } else {
    rw_sgd p = take_params<rw_sgd>(in);
    in.finish();
    if (p.n != n) std::exit(3);
    if (p.has_momentum) {
      rw_launch(GRID, BLOCK, [&] { rw_sgd_buf<T>(b0.data(), g.data(), theta.data(), p); });
      rw_launch(GRID, BLOCK, [&] { rw_sgd_theta<T>(theta.data(), g.data(), b0.data(), p); });
    } else {
      rw_launch(GRID, BLOCK, [&] { rw_sgd_theta<T>(theta.data(), g.data(), g.data(), p); });
    }
  }
  rw_write_doubles(theta);
  rw_write_doubles(b0);
  rw_write_doubles(b1);
}

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s INPUT\n", argv[0]);
    return 2;
  }
  rw_input in(argv[1]);
  std::vector<unsigned int> head = in.take<unsigned int>(2);
  const unsigned long long n = in.take<unsigned long long>(1)[0];
  if (head[1])
    run<float>(in, head[0], n);
  else
    run<double>(in, head[0], n);
  return 0;
}
