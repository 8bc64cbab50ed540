// Element-wise and row kernels of the CUDA backend: f32 activations, f32 arithmetic, in the same
// order as the CPU kernels where the order changes the result (RMSNorm: (x * rsqrt) * weight).

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "common/kernels/cuda/cuda_kernels.h"

namespace tandem::kernels::cuda {
namespace {

constexpr int kThreads = 256;

int Blocks(int64_t n) { return static_cast<int>((n + kThreads - 1) / kThreads); }

__device__ float LoadAsFloat(const void* base, DType dtype, int64_t i) {
  switch (dtype) {
    case DType::kF32:
      return static_cast<const float*>(base)[i];
    case DType::kF16:
      return __half2float(static_cast<const __half*>(base)[i]);
    case DType::kBF16:
      return __bfloat162float(static_cast<const __nv_bfloat16*>(base)[i]);
    default:
      return 0.0f;
  }
}

__global__ void EmbedKernel(const void* table, DType dtype, int64_t cols, const int32_t* tokens,
                            float* out) {
  const int64_t row = blockIdx.x;
  const int64_t src = static_cast<int64_t>(tokens[row]) * cols;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    out[row * cols + c] = LoadAsFloat(table, dtype, src + c);
  }
}

// Sum over the block of every thread's `v`; the result is valid in every thread.
__device__ float BlockSum(float v) {
  __shared__ float partial[32];
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  const int warps = (blockDim.x + 31) / 32;
  v = lane < warps ? partial[lane] : 0.0f;
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  __syncthreads();  // partial[] may be reused by the caller's next BlockSum
  return v;
}

__global__ void RmsNormKernel(const float* x, const float* weight, float eps, int64_t dim,
                              float* y) {
  const float* xr = x + blockIdx.x * dim;
  float* yr = y + blockIdx.x * dim;
  float sum = 0.0f;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) sum += xr[i] * xr[i];
  sum = BlockSum(sum);
  const float inv = 1.0f / sqrtf(sum / static_cast<float>(dim) + eps);
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) yr[i] = (xr[i] * inv) * weight[i];
}

__global__ void SiluMulKernel(const float* gate_up, int64_t rows, int64_t dim, float* out) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= rows * dim) return;
  const int64_t r = i / dim, c = i % dim;
  const float g = gate_up[r * 2 * dim + c];
  const float u = gate_up[r * 2 * dim + dim + c];
  out[i] = g / (1.0f + expf(-g)) * u;
}

__global__ void AddKernel(float* y, const float* x, int64_t n) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) y[i] += x[i];
}

__global__ void ScaleKernel(float* x, float factor, int64_t n) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) x[i] *= factor;
}

// One block per row; threads over (head, pair j) of q's heads, then k's. The angle is computed
// in double, as the CPU does: a float angle loses ~pos * 2^-24 rad.
__global__ void RopeKernel(float* q, int q_heads, float* k, int k_heads, int head_dim,
                           const int64_t* positions, const float* inv_freq) {
  const int64_t row = blockIdx.x;
  const int half = head_dim / 2;
  const double pos = static_cast<double>(positions[row]);
  const int pairs = (q != nullptr ? q_heads : 0) * half + (k != nullptr ? k_heads : 0) * half;
  for (int i = threadIdx.x; i < pairs; i += blockDim.x) {
    const int q_pairs = (q != nullptr ? q_heads : 0) * half;
    const bool is_q = i < q_pairs;
    const int local = is_q ? i : i - q_pairs;
    const int head = local / half, j = local % half;
    float* base =
        is_q ? q + (row * q_heads + head) * head_dim : k + (row * k_heads + head) * head_dim;
    double s, c;
    sincos(pos * static_cast<double>(inv_freq[j]), &s, &c);
    const float cf = static_cast<float>(c), sf = static_cast<float>(s);
    const float a = base[j], b = base[j + half];
    base[j] = a * cf - b * sf;
    base[j + half] = b * cf + a * sf;
  }
}

__global__ void MoveRowsKernel(const float* src, int64_t width, const int64_t* rows, float* dst,
                               bool scatter) {
  const int64_t i = blockIdx.x;
  const float* from = src + (scatter ? i : rows[i]) * width;
  float* to = dst + (scatter ? rows[i] : i) * width;
  for (int64_t c = threadIdx.x; c < width; c += blockDim.x) to[c] = from[c];
}

__global__ void ConvertRowsKernel(const float* x, int64_t rows, int64_t cols, int64_t x_stride,
                                  DType dtype, void* out) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= rows * cols) return;
  const float v = x[(i / cols) * x_stride + i % cols];
  if (dtype == DType::kF16) {
    static_cast<__half*>(out)[i] = __float2half_rn(v);
  } else {
    static_cast<__nv_bfloat16*>(out)[i] = __float2bfloat16_rn(v);
  }
}

}  // namespace

void LaunchEmbed(const void* table, DType dtype, int64_t cols, const int32_t* tokens, int64_t n,
                 float* out, cudaStream_t stream) {
  if (n > 0) EmbedKernel<<<n, kThreads, 0, stream>>>(table, dtype, cols, tokens, out);
}

void LaunchRmsNorm(const float* x, const float* weight, float eps, int64_t rows, int64_t dim,
                   float* y, cudaStream_t stream) {
  if (rows > 0)
    RmsNormKernel<<<rows, dim >= 1024 ? 1024 : 256, 0, stream>>>(x, weight, eps, dim, y);
}

void LaunchSiluMul(const float* gate_up, int64_t rows, int64_t dim, float* out,
                   cudaStream_t stream) {
  if (rows * dim > 0)
    SiluMulKernel<<<Blocks(rows * dim), kThreads, 0, stream>>>(gate_up, rows, dim, out);
}

void LaunchAdd(float* y, const float* x, int64_t n, cudaStream_t stream) {
  if (n > 0) AddKernel<<<Blocks(n), kThreads, 0, stream>>>(y, x, n);
}

void LaunchScale(float* x, float factor, int64_t n, cudaStream_t stream) {
  if (n > 0) ScaleKernel<<<Blocks(n), kThreads, 0, stream>>>(x, factor, n);
}

void LaunchRope(float* q, int q_heads, float* k, int k_heads, int head_dim, int64_t rows,
                const int64_t* positions, const float* inv_freq, cudaStream_t stream) {
  if (rows > 0 && head_dim >= 2) {
    RopeKernel<<<rows, 128, 0, stream>>>(q, q_heads, k, k_heads, head_dim, positions, inv_freq);
  }
}

void LaunchMoveRows(const float* src, int64_t width, const int64_t* rows, int64_t n, float* dst,
                    bool scatter, cudaStream_t stream) {
  if (n > 0) MoveRowsKernel<<<n, kThreads, 0, stream>>>(src, width, rows, dst, scatter);
}

void LaunchConvertRows(const float* x, int64_t rows, int64_t cols, int64_t x_stride, DType dtype,
                       void* out, cudaStream_t stream) {
  if (rows * cols > 0) {
    ConvertRowsKernel<<<Blocks(rows * cols), kThreads, 0, stream>>>(x, rows, cols, x_stride, dtype,
                                                                    out);
  }
}

}  // namespace tandem::kernels::cuda
