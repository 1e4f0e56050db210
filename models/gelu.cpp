// GELU (tanh approximation) as one fused CPU kernel (see gelu.h).
//
// With z = 2u = x (a + b x^2), a = 2 sqrt(2/pi), b = a * 0.044715, and s = sigmoid(z):
//   forward   y  = x s
//   backward  dx = dy (s + x s (1 - s) (a + 3 b x^2))
// (LibTorch's tanh form, 0.5 x (1 + t) and 0.5 (1 + t) + 0.5 x (1 - t^2) du/dx, rewritten with
// 1 + t = 2s and 1 - t^2 = 4 s (1 - s).) exp is Cephes' single-precision polynomial (as in
// avx_mathfun), about 1 ulp; a run of fewer than 8 elements is padded and goes through the same
// vector code, so an element's result never depends on where a thread's range starts.
#include "models/gelu.h"

#include <ATen/Parallel.h>
#include <ATen/record_function.h>

#include <algorithm>
#include <cmath>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace lm {
namespace {

constexpr float kA = 1.5957691216057308f;     // 2 sqrt(2/pi)
constexpr float kB = 1.5957691216057308f * 0.044715f;
constexpr int64_t kGrain = 1 << 15;           // elements per parallel_for task

// The portable version of the same formulas (CPUs without AVX2+FMA, non-x86 builds).
inline float sigmoid_z(float x) { return 1.0f / (1.0f + std::exp(-x * (kA + kB * x * x))); }

void forward_scalar(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] * sigmoid_z(x[i]);
}

void backward_scalar(const float* x, const float* g, float* dx, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float s = sigmoid_z(x[i]);
    dx[i] = g[i] * (s + x[i] * s * (1.0f - s) * (kA + 3.0f * kB * x[i] * x[i]));
  }
}

#if defined(__x86_64__)
#define LM_AVX2 __attribute__((target("avx2,fma")))

LM_AVX2 inline __m256 exp8(__m256 x) {  // Cephes expf; |x| clamped to 88 (finite 2^n)
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-88.0f)), _mm256_set1_ps(88.0f));
  __m256 fx = _mm256_floor_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f)));
  x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
  x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), x);
  __m256 y = _mm256_set1_ps(1.9875691500e-4f);
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507e-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073e-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894e-2f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459e-1f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201e-1f));
  y = _mm256_add_ps(_mm256_fmadd_ps(y, _mm256_mul_ps(x, x), x), _mm256_set1_ps(1.0f));
  __m256i n = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(fx), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(y, _mm256_castsi256_ps(n));
}

LM_AVX2 inline __m256 sigmoid_z8(__m256 x, __m256 x2) {  // sigmoid(x (a + b x^2))
  __m256 z = _mm256_mul_ps(x, _mm256_fmadd_ps(_mm256_set1_ps(kB), x2, _mm256_set1_ps(kA)));
  __m256 one = _mm256_set1_ps(1.0f);
  return _mm256_div_ps(one, _mm256_add_ps(one, exp8(_mm256_sub_ps(_mm256_setzero_ps(), z))));
}

LM_AVX2 inline void forward8(const float* x, float* y) {
  __m256 v = _mm256_loadu_ps(x);
  _mm256_storeu_ps(y, _mm256_mul_ps(v, sigmoid_z8(v, _mm256_mul_ps(v, v))));
}

LM_AVX2 inline void backward8(const float* x, const float* g, float* dx) {
  __m256 v = _mm256_loadu_ps(x), v2 = _mm256_mul_ps(v, v), s = sigmoid_z8(v, v2);
  __m256 dz = _mm256_fmadd_ps(_mm256_set1_ps(3.0f * kB), v2, _mm256_set1_ps(kA));
  __m256 slope = _mm256_mul_ps(_mm256_mul_ps(v, s), _mm256_sub_ps(_mm256_set1_ps(1.0f), s));
  _mm256_storeu_ps(dx, _mm256_mul_ps(_mm256_loadu_ps(g), _mm256_fmadd_ps(slope, dz, s)));
}

LM_AVX2 void forward_avx2(const float* x, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) forward8(x + i, y + i);
  if (i == n) return;
  float bx[8] = {}, by[8];
  std::copy(x + i, x + n, bx);
  forward8(bx, by);
  std::copy(by, by + (n - i), y + i);
}

LM_AVX2 void backward_avx2(const float* x, const float* g, float* dx, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) backward8(x + i, g + i, dx + i);
  if (i == n) return;
  float bx[8] = {}, bg[8] = {}, bd[8];
  std::copy(x + i, x + n, bx);
  std::copy(g + i, g + n, bg);
  backward8(bx, bg, bd);
  std::copy(bd, bd + (n - i), dx + i);
}

bool has_avx2() {
  static const bool yes = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return yes;
}
#endif

torch::Tensor forward_kernel(const torch::Tensor& x) {
  RECORD_FUNCTION("lm::gelu_tanh", std::vector<c10::IValue>({x}));
  auto y = torch::empty_like(x);
  const float* px = x.data_ptr<float>();
  float* py = y.data_ptr<float>();
  at::parallel_for(0, x.numel(), kGrain, [&](int64_t b, int64_t e) {
#if defined(__x86_64__)
    if (has_avx2()) return forward_avx2(px + b, py + b, e - b);
#endif
    forward_scalar(px + b, py + b, e - b);
  });
  return y;
}

torch::Tensor backward_kernel(const torch::Tensor& x, const torch::Tensor& grad) {
  RECORD_FUNCTION("lm::gelu_tanh_backward", std::vector<c10::IValue>({grad, x}));
  auto g = grad.contiguous();
  auto dx = torch::empty_like(x);
  const float *px = x.data_ptr<float>(), *pg = g.data_ptr<float>();
  float* pd = dx.data_ptr<float>();
  at::parallel_for(0, x.numel(), kGrain, [&](int64_t b, int64_t e) {
#if defined(__x86_64__)
    if (has_avx2()) return backward_avx2(px + b, pg + b, pd + b, e - b);
#endif
    backward_scalar(px + b, pg + b, pd + b, e - b);
  });
  return dx;
}

struct GeluTanh : torch::autograd::Function<GeluTanh> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x) {
    ctx->save_for_backward({x});
    return forward_kernel(x);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    return {backward_kernel(ctx->get_saved_variables()[0], grads[0])};
  }
};

}  // namespace

torch::Tensor gelu_tanh(const torch::Tensor& x) {
  if (!x.device().is_cpu() || x.scalar_type() != torch::kFloat || x.layout() != torch::kStrided)
    return torch::gelu(x, "tanh");
  auto xc = x.contiguous();
  if (!torch::GradMode::is_enabled() || !xc.requires_grad()) return forward_kernel(xc);
  return GeluTanh::apply(xc);
}

}  // namespace lm
