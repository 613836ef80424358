// The ReLU of the models (`models::layers::relu`) on a CUDA device: forward, the residual sum
// and ReLU of a ResNet block's end in one pass, and the gradient through a ReLU from its output.
// One thread per value (grid-stride). Compiled at run time by NVRTC (no include, no host code),
// and on the host by the emulation test of that module.
//
// Semantics are those of the CPU's fused ops (`models::cpu_ops`) and PyTorch's: the forward
// cuts negative values (a NaN passes), the gradient passes where the output is > 0
// (`threshold_backward`; candle's own ReLU passes it where the input is >= 0).

template <typename T>
__device__ __forceinline__ T rw_cut(T v) {
  return v < (T)0 ? (T)0 : v;
}

__device__ __forceinline__ unsigned long long rw_first() {
  return (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ unsigned long long rw_stride() {
  return (unsigned long long)gridDim.x * blockDim.x;
}

template <typename T>
__device__ void rw_relu(const T* x, T* y, unsigned long long n) {
  for (unsigned long long i = rw_first(); i < n; i += rw_stride()) y[i] = rw_cut(x[i]);
}

template <typename T>
__device__ void rw_add_relu(const T* a, const T* b, T* y, unsigned long long n) {
  for (unsigned long long i = rw_first(); i < n; i += rw_stride()) y[i] = rw_cut(a[i] + b[i]);
}

template <typename T>
__device__ void rw_relu_grad(const T* y, const T* g, T* out, unsigned long long n) {
  for (unsigned long long i = rw_first(); i < n; i += rw_stride())
    out[i] = y[i] > (T)0 ? g[i] : (T)0;
}

#define RW_RELU_KERNELS(T, SUFFIX)                                                             \
  extern "C" __global__ void rankwise_relu_##SUFFIX(const T* x, T* y, unsigned long long n) {  \
    rw_relu<T>(x, y, n);                                                                       \
  }                                                                                            \
  extern "C" __global__ void rankwise_add_relu_##SUFFIX(const T* a, const T* b, T* y,          \
                                                        unsigned long long n) {                \
    rw_add_relu<T>(a, b, y, n);                                                                \
  }                                                                                            \
  extern "C" __global__ void rankwise_relu_grad_##SUFFIX(const T* y, const T* g, T* out,       \
                                                         unsigned long long n) {               \
    rw_relu_grad<T>(y, g, out, n);                                                             \
  }

RW_RELU_KERNELS(float, f32)
RW_RELU_KERNELS(double, f64)
