// The optimizers' updates (`train::optim`) on a CUDA device, in place: Adam / AdamW as one
// kernel for every parameter tensor of a group (first moment, second moment and parameter of
// each value in turn, the tensors' addresses in a table), SGD as two per tensor (momentum
// buffer, parameter), one thread per element (grid-stride). The module documentation of `device.rs` beside this
// file says why. Compiled at run time by NVRTC (no include, no host code), and on the host by
// the emulation test of that module.
//
// The arithmetic is that of the tensor formulation (`adam_update`, `sgd_update`) operation by
// operation, in the parameter's type: each scalar product `x * c` is candle's affine
// `x * (T)c + (T)0`, a sum with a scalar `x * (T)1 + (T)c`, and every operation is rounded on
// its own (`__fmul_rn` & co.: NVRTC would otherwise contract a product and a sum into one fused
// multiply-add, whose single rounding differs in the last bit), so an update equals the CPU's.

struct rw_adam {
  unsigned long long n;
  double wd;               // L2 weight decay added to the gradient (Adam)
  double lerp_mul;         // the first moment's lerp: w = 1 - beta1, or 1 - w when w >= 0.5
  double beta2;
  double one_minus_beta2;
  double shrink;           // AdamW's 1 - lr * wd
  double inv_bc2_sqrt;     // 1 / sqrt(1 - beta2^t)
  double eps;
  double neg_step;         // -lr / (1 - beta1^t)
  int coupled;             // Adam with wd != 0
  int decoupled;           // AdamW with wd != 0
  int lerp_hi;             // w >= 0.5: lerp as end - (end - start)(1 - w)
  int pad;
};

struct rw_sgd {
  unsigned long long n;
  double wd;
  double momentum;
  double one_minus_dampening;
  double neg_lr;
  int coupled;   // wd != 0
  int has_momentum;
  int nesterov;
  int first;     // the buffer's first step: b = g
};

__device__ __forceinline__ float rw_mul(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ double rw_mul(double a, double b) { return __dmul_rn(a, b); }
__device__ __forceinline__ float rw_add(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ double rw_add(double a, double b) { return __dadd_rn(a, b); }
__device__ __forceinline__ float rw_sub(float a, float b) { return __fsub_rn(a, b); }
__device__ __forceinline__ double rw_sub(double a, double b) { return __dsub_rn(a, b); }
__device__ __forceinline__ float rw_div(float a, float b) { return __fdiv_rn(a, b); }
__device__ __forceinline__ double rw_div(double a, double b) { return __ddiv_rn(a, b); }
__device__ __forceinline__ float rw_sqrt(float a) { return __fsqrt_rn(a); }
__device__ __forceinline__ double rw_sqrt(double a) { return __dsqrt_rn(a); }

// candle's affine `x * mul + add`, both constants in T.
template <typename T>
__device__ __forceinline__ T rw_affine(T x, double mul, double add) {
  return rw_add(rw_mul(x, (T)mul), (T)add);
}

// The first element of this thread and the grid's stride.
__device__ __forceinline__ unsigned long long rw_first() {
  return (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ unsigned long long rw_stride() {
  return (unsigned long long)gridDim.x * blockDim.x;
}

// Adam's gradient: with coupled weight decay g + theta * wd.
// (theta is read only then.)
template <typename T>
__device__ __forceinline__ T rw_adam_grad(const T* g, const T* theta, unsigned long long i,
                                          const rw_adam& p) {
  return p.coupled ? rw_add(g[i], rw_affine(theta[i], p.wd, 0.0)) : g[i];
}

// Value i of one Adam update, from the old theta, m and v:
//   m <- lerp(m, g, 1 - beta1) (PyTorch's lerp: start + w (end - start) for w < 0.5),
//   v <- v * beta2 + (g * (1 - beta2)) * g,
//   theta <- theta' + (m / (sqrt(v) / sqrt(bc2) + eps)) * (-lr / bc1), theta' = theta (1 - lr wd)
//   for AdamW, with the new m and v.
template <typename T>
__device__ __forceinline__ void rw_adam_value(T* theta, const T* g, T* m, T* v,
                                              unsigned long long i, const rw_adam& p) {
  const T gi = rw_adam_grad(g, theta, i, p);
  const T part = rw_affine(rw_sub(gi, m[i]), p.lerp_mul, 0.0);
  const T mi = p.lerp_hi ? rw_sub(gi, part) : rw_add(m[i], part);
  const T vi =
      rw_add(rw_affine(v[i], p.beta2, 0.0), rw_mul(rw_affine(gi, p.one_minus_beta2, 0.0), gi));
  const T t = p.decoupled ? rw_affine(theta[i], p.shrink, 0.0) : theta[i];
  const T denom = rw_affine(rw_affine(rw_sqrt(vi), p.inv_bc2_sqrt, 0.0), 1.0, p.eps);
  m[i] = mi;
  v[i] = vi;
  theta[i] = rw_add(t, rw_affine(rw_div(mi, denom), p.neg_step, 0.0));
}

// One parameter tensor of a group's update: the device addresses of its value, gradient and
// two moments, and its constants (p.n: its length).
struct rw_adam_tensor {
  unsigned long long theta, g, m, v;
  rw_adam p;
};

// A block's share of the update: values start .. start + chunk of tensor `tensor`.
struct rw_adam_block {
  unsigned long long tensor, start;
};

// Block b updates its share of the table's tensors, its threads striding over it.
template <typename T>
__device__ void rw_adam_many(const rw_adam_tensor* tensors, const rw_adam_block* blocks,
                             unsigned long long chunk) {
  const rw_adam_block b = blocks[blockIdx.x];
  const rw_adam_tensor& e = tensors[b.tensor];
  const unsigned long long end = b.start + chunk < e.p.n ? b.start + chunk : e.p.n;
  for (unsigned long long i = b.start + threadIdx.x; i < end; i += blockDim.x)
    rw_adam_value<T>((T*)e.theta, (const T*)e.g, (T*)e.m, (T*)e.v, i, e.p);
}

// SGD's gradient: with weight decay g + theta * wd.
template <typename T>
__device__ __forceinline__ T rw_sgd_grad(const T* g, const T* theta, unsigned long long i,
                                         const rw_sgd& p) {
  return p.coupled ? rw_add(g[i], rw_affine(theta[i], p.wd, 0.0)) : g[i];
}

// b <- g at the first step, b * momentum + g * (1 - dampening) after.
template <typename T>
__device__ void rw_sgd_buf(T* b, const T* g, const T* theta, rw_sgd p) {
  for (unsigned long long i = rw_first(); i < p.n; i += rw_stride()) {
    const T gi = rw_sgd_grad(g, theta, i, p);
    b[i] = p.first ? gi
                   : rw_add(rw_affine(b[i], p.momentum, 0.0),
                            rw_affine(gi, p.one_minus_dampening, 0.0));
  }
}

// theta <- theta + d * (-lr), d = g + b * momentum (Nesterov), b (momentum) or g; b already
// updated (not read without momentum).
template <typename T>
__device__ void rw_sgd_theta(T* theta, const T* g, const T* b, rw_sgd p) {
  for (unsigned long long i = rw_first(); i < p.n; i += rw_stride()) {
    const T gi = rw_sgd_grad(g, theta, i, p);
    T d = gi;
    if (p.has_momentum) d = p.nesterov ? rw_add(gi, rw_affine(b[i], p.momentum, 0.0)) : b[i];
    theta[i] = rw_add(theta[i], rw_affine(d, p.neg_lr, 0.0));
  }
}

#define RW_OPTIM_KERNELS(T, SUFFIX)                                                          \
  extern "C" __global__ void rankwise_adam_many_##SUFFIX(                                   \
      const rw_adam_tensor* tensors, const rw_adam_block* blocks, unsigned long long chunk) {  \
    rw_adam_many<T>(tensors, blocks, chunk);                                                 \
  }                                                                                          \
  extern "C" __global__ void rankwise_sgd_buf_##SUFFIX(T* b, const T* g, const T* theta,     \
                                                       rw_sgd p) {                           \
    rw_sgd_buf<T>(b, g, theta, p);                                                           \
  }                                                                                          \
  extern "C" __global__ void rankwise_sgd_theta_##SUFFIX(T* theta, const T* g, const T* b,   \
                                                         rw_sgd p) {                         \
    rw_sgd_theta<T>(theta, g, b, p);                                                         \
  }

RW_OPTIM_KERNELS(float, f32)
RW_OPTIM_KERNELS(double, f64)
