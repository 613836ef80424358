// BatchNorm's running averages (`models::layers::running_stats`) on a CUDA device, in place:
// running <- running * keep + batch * take, one thread per channel value (grid-stride); the
// batch variance may be given as cuDNN's 1/sqrt(var + eps). Compiled
// at run time by NVRTC (no include, no host code), and on the host by the emulation test of
// that module. The operations are the tensor formulation's (`BatchNorm2d::update_running_stats`:
// two scalar products, candle's affine `x * (T)c + (T)0`, and a sum), each rounded on its own
// (`__fmul_rn` & co.: no fused multiply-add), so the update equals the CPU's bit for bit.

struct rw_ema {
  unsigned long long n;
  double keep;  // 1 - momentum
  double take;  // momentum (mean), momentum * n / (n - 1) (variance)
  double eps;
  int from_inv_std;  // the batch statistic is cuDNN's 1/sqrt(var + eps): var = 1/s^2 - eps
  int pad;
};

__device__ __forceinline__ float rw_mul(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ double rw_mul(double a, double b) { return __dmul_rn(a, b); }
__device__ __forceinline__ float rw_add(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ double rw_add(double a, double b) { return __dadd_rn(a, b); }
__device__ __forceinline__ float rw_div(float a, float b) { return __fdiv_rn(a, b); }
__device__ __forceinline__ double rw_div(double a, double b) { return __ddiv_rn(a, b); }

// The batch variance from cuDNN's saved 1/sqrt(var + eps), as the tensor formulation computes
// it: sqr, recip, then the affine `x * 1 - eps`.
template <typename T>
__device__ __forceinline__ T rw_var_of(T s, double eps) {
  const T recip = rw_div((T)1.0, rw_mul(s, s));
  return rw_add(rw_mul(recip, (T)1.0), (T)(-eps));
}

template <typename T>
__device__ void rw_ema_update(T* running, const T* batch, rw_ema p) {
  const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
  for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < p.n;
       i += stride) {
    const T kept = rw_add(rw_mul(running[i], (T)p.keep), (T)0.0);
    const T b = p.from_inv_std ? rw_var_of(batch[i], p.eps) : batch[i];
    const T taken = rw_add(rw_mul(b, (T)p.take), (T)0.0);
    running[i] = rw_add(kept, taken);
  }
}

extern "C" __global__ void rankwise_ema_f32(float* running, const float* batch, rw_ema p) {
  rw_ema_update<float>(running, batch, p);
}
extern "C" __global__ void rankwise_ema_f64(double* running, const double* batch, rw_ema p) {
  rw_ema_update<double>(running, batch, p);
}
