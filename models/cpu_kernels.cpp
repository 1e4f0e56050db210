// Fused CPU kernels: GELU (tanh approximation), the summed cross-entropy and the causal attention
// of packed heads (see cpu_kernels.h).
//
// GELU. With z = 2u = x (a + b x^2), a = 2 sqrt(2/pi), b = a * 0.044715, and s = sigmoid(z):
//   forward   y  = x s
//   backward  dx = dy (s + x s (1 - s) (a + 3 b x^2))
// (LibTorch's tanh form, 0.5 x (1 + t) and 0.5 (1 + t) + 0.5 x (1 - t^2) du/dx, rewritten with
// 1 + t = 2s and 1 - t^2 = 4 s (1 - s).) exp is Cephes' single-precision polynomial (as in
// avx_mathfun), about 1 ulp; a run of fewer than 8 elements is padded and goes through the same
// vector code, so an element's result never depends on where a thread's range starts.
// Cross-entropy. Per row with target t: m = max x, lse = m + log sum exp(x - m), loss = lse - x_t;
// backward dx = dloss (exp(x - lse) - [j = t]). Rows go whole to one thread; the rows' losses
// are added in row order in double. With the z-loss z lse^2 beside it (cross_entropy_z_sum):
// dx = (dloss + dz 2 z lse) exp(x - lse) - dloss [j = t], the same one pass with another scale.
// Attention. Per head, row-major: S = scale q k^T, P = causal softmax of S (the loss's row
// helpers), y = P v; backward dv = P^T dy, dP = dy v^T, dS = P (dP - rowsum(P dP)),
// dq = scale dS k, dk = scale dS^T q. With documents (data.doc_mask) the same on each document's
// diagonal block of S alone: a query never sees another document, so the other blocks are skipped.
#include "models/cpu_kernels.h"

#include <ATen/Parallel.h>
#include <ATen/record_function.h>
#include <dlfcn.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <vector>

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

void gelu_forward_scalar(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] * sigmoid_z(x[i]);
}

void gelu_backward_scalar(const float* x, const float* g, float* dx, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float s = sigmoid_z(x[i]);
    dx[i] = g[i] * (s + x[i] * s * (1.0f - s) * (kA + 3.0f * kB * x[i] * x[i]));
  }
}

float row_max_scalar(const float* x, int64_t n) { return *std::max_element(x, x + n); }

// Summed in double: one float accumulator over a row of V terms adds up to V rounding errors (the
// AVX2 path's 8 lanes, V / 8 each), which the loss's gradient p (1 + err) carries: 1.7e-6 at V = 1003,
// 2.7x LibTorch's own kernel (CrossEntropy.MatchesLibTorchsSummedLossAndGradient under
// ATEN_CPU_CAPABILITY=default).
float row_sum_exp_scalar(const float* x, int64_t n, float shift) {
  double s = 0;
  for (int64_t j = 0; j < n; ++j) s += std::exp(x[j] - shift);
  return static_cast<float>(s);
}

void row_softmax_scalar(const float* x, float* dx, int64_t n, float m, float logs, float g) {
  for (int64_t j = 0; j < n; ++j) dx[j] = std::exp((x[j] - m) - logs) * g;
}

#if defined(__x86_64__)
#define LM_AVX2 __attribute__((target("avx2,fma")))

LM_AVX2 inline __m256 exp8(__m256 x) {  // Cephes expf; |x| clamped to 88 (finite 2^n)
  // Operand order keeps a NaN (max/min return the second operand when either is NaN).
  x = _mm256_min_ps(_mm256_set1_ps(88.0f), _mm256_max_ps(_mm256_set1_ps(-88.0f), x));
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

LM_AVX2 inline void gelu_forward8(const float* x, float* y) {
  __m256 v = _mm256_loadu_ps(x);
  _mm256_storeu_ps(y, _mm256_mul_ps(v, sigmoid_z8(v, _mm256_mul_ps(v, v))));
}

LM_AVX2 inline void gelu_backward8(const float* x, const float* g, float* dx) {
  __m256 v = _mm256_loadu_ps(x), v2 = _mm256_mul_ps(v, v), s = sigmoid_z8(v, v2);
  __m256 dz = _mm256_fmadd_ps(_mm256_set1_ps(3.0f * kB), v2, _mm256_set1_ps(kA));
  __m256 slope = _mm256_mul_ps(_mm256_mul_ps(v, s), _mm256_sub_ps(_mm256_set1_ps(1.0f), s));
  _mm256_storeu_ps(dx, _mm256_mul_ps(_mm256_loadu_ps(g), _mm256_fmadd_ps(slope, dz, s)));
}

LM_AVX2 void gelu_forward_avx2(const float* x, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) gelu_forward8(x + i, y + i);
  if (i == n) return;
  float bx[8] = {}, by[8];
  std::copy(x + i, x + n, bx);
  gelu_forward8(bx, by);
  std::copy(by, by + (n - i), y + i);
}

LM_AVX2 void gelu_backward_avx2(const float* x, const float* g, float* dx, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) gelu_backward8(x + i, g + i, dx + i);
  if (i == n) return;
  float bx[8] = {}, bg[8] = {}, bd[8];
  std::copy(x + i, x + n, bx);
  std::copy(g + i, g + n, bg);
  gelu_backward8(bx, bg, bd);
  std::copy(bd, bd + (n - i), dx + i);
}

// Cross-entropy rows. A tail of fewer than 8 logits is padded with `shift` (exp(0) = 1, then left
// out), so every logit goes through the vector exp.
LM_AVX2 float row_max_avx2(const float* x, int64_t n) {
  __m256 m = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) m = _mm256_max_ps(m, _mm256_loadu_ps(x + j));
  float b[8];
  _mm256_storeu_ps(b, m);
  float r = *std::max_element(b, b + 8);  // a NaN may be lost here; the exp pass keeps it
  for (; j < n; ++j) r = std::max(r, x[j]);
  return r;
}

// exp((x - shift) - shift2) of 8 logits (n >= 8) or of a padded tail of n < 8.
LM_AVX2 inline __m256 exp_shifted8(const float* x, int64_t n, float shift, float shift2, float* pad) {
  if (n < 8) {
    std::fill(pad, pad + 8, shift);
    std::copy(x, x + n, pad);
    x = pad;
  }
  __m256 d = _mm256_sub_ps(_mm256_loadu_ps(x), _mm256_set1_ps(shift));
  return exp8(shift2 == 0.0f ? d : _mm256_sub_ps(d, _mm256_set1_ps(shift2)));
}

LM_AVX2 float row_sum_exp_avx2(const float* x, int64_t n, float shift) {  // sum exp(x - shift)
  __m256 acc = _mm256_setzero_ps();
  float pad[8], b[8];
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) acc = _mm256_add_ps(acc, exp_shifted8(x + j, 8, shift, 0.0f, pad));
  _mm256_storeu_ps(b, acc);
  float s = ((b[0] + b[1]) + (b[2] + b[3])) + ((b[4] + b[5]) + (b[6] + b[7]));
  if (j == n) return s;
  _mm256_storeu_ps(b, exp_shifted8(x + j, n - j, shift, 0.0f, pad));
  for (int64_t k = 0; k < n - j; ++k) s += b[k];
  return s;
}

// g exp((x - m) - logs)
LM_AVX2 void row_softmax_avx2(const float* x, float* dx, int64_t n, float m, float logs, float g) {
  float pad[8], b[8];
  const __m256 vg = _mm256_set1_ps(g);
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) _mm256_storeu_ps(dx + j, _mm256_mul_ps(exp_shifted8(x + j, 8, m, logs, pad), vg));
  if (j == n) return;
  _mm256_storeu_ps(b, _mm256_mul_ps(exp_shifted8(x + j, n - j, m, logs, pad), vg));
  std::copy(b, b + (n - j), dx + j);
}

// The AVX2 path where the CPU has AVX2+FMA and ATen runs its AVX2 kernels or better: with
// ATEN_CPU_CAPABILITY=default (LibTorch's switch to its portable kernels, which ATen itself honours)
// the portable loops run too, so a process can run what a CPU without AVX2 would.
bool has_avx2() {
  static const bool yes = [] {
    const char* cap = std::getenv("ATEN_CPU_CAPABILITY");
    const bool portable = cap != nullptr && std::strcmp(cap, "default") == 0;
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && !portable;
  }();
  return yes;
}
#endif

torch::Tensor gelu_tanh_forward(const torch::Tensor& x) {
  RECORD_FUNCTION("lm::gelu_tanh", std::vector<c10::IValue>({x}));
  auto y = torch::empty_like(x);
  const float* px = x.data_ptr<float>();
  float* py = y.data_ptr<float>();
  at::parallel_for(0, x.numel(), kGrain, [&](int64_t b, int64_t e) {
#if defined(__x86_64__)
    if (has_avx2()) return gelu_forward_avx2(px + b, py + b, e - b);
#endif
    gelu_forward_scalar(px + b, py + b, e - b);
  });
  return y;
}

torch::Tensor gelu_tanh_backward(const torch::Tensor& x, const torch::Tensor& grad) {
  RECORD_FUNCTION("lm::gelu_tanh_backward", std::vector<c10::IValue>({grad, x}));
  auto g = grad.contiguous();
  auto dx = torch::empty_like(x);
  const float *px = x.data_ptr<float>(), *pg = g.data_ptr<float>();
  float* pd = dx.data_ptr<float>();
  at::parallel_for(0, x.numel(), kGrain, [&](int64_t b, int64_t e) {
#if defined(__x86_64__)
    if (has_avx2()) return gelu_backward_avx2(px + b, pg + b, pd + b, e - b);
#endif
    gelu_backward_scalar(px + b, pg + b, pd + b, e - b);
  });
  return dx;
}

struct GeluTanh : torch::autograd::Function<GeluTanh> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x) {
    ctx->save_for_backward({x});
    return gelu_tanh_forward(x);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    return {gelu_tanh_backward(ctx->get_saved_variables()[0], grads[0])};
  }
};

// One row of the loss: its log-sum-exp as max m and log sum exp(x - m), kept apart (as LibTorch's
// log_softmax does) so that x - m is exact before the log is taken off.
void row_lse(const float* x, int64_t n, float* m_logs) {
#if defined(__x86_64__)
  if (has_avx2()) {
    m_logs[0] = row_max_avx2(x, n);
    m_logs[1] = std::log(row_sum_exp_avx2(x, n, m_logs[0]));
    return;
  }
#endif
  m_logs[0] = row_max_scalar(x, n);
  m_logs[1] = std::log(row_sum_exp_scalar(x, n, m_logs[0]));
}

void row_softmax(const float* x, float* dx, int64_t n, const float* m_logs, float g) {
#if defined(__x86_64__)
  if (has_avx2()) return row_softmax_avx2(x, dx, n, m_logs[0], m_logs[1], g);
#endif
  row_softmax_scalar(x, dx, n, m_logs[0], m_logs[1], g);
}

// The loss's forward, shared by the cross-entropy alone and with the z-loss: each row's m and
// log sum exp(x - m) into lse (N, 2), and the sums over the rows whose target is not -1, in double
// in row order, of the losses and (with_z) of the squared log-sum-exps lse_i = m + log sum exp(x - m).
struct LossSums {
  double ce = 0, lse_sq = 0;
};
LossSums ce_forward(const torch::Tensor& logits, const torch::Tensor& targets, const torch::Tensor& lse, bool with_z) {
  const int64_t N = logits.size(0), V = logits.size(1);
  const float* px = logits.data_ptr<float>();
  const int64_t* pt = targets.data_ptr<int64_t>();
  float* pl = lse.data_ptr<float>();
  std::vector<double> row_loss(N, 0.0), row_sq(with_z ? N : 0, 0.0);
  at::parallel_for(0, N, std::max<int64_t>(1, kGrain / V), [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      if (pt[i] < 0) continue;
      row_lse(px + i * V, V, pl + 2 * i);
      row_loss[i] = static_cast<double>(pl[2 * i + 1]) - (px[i * V + pt[i]] - pl[2 * i]);
      if (with_z) {
        const double l = static_cast<double>(pl[2 * i]) + pl[2 * i + 1];
        row_sq[i] = l * l;
      }
    }
  });
  LossSums out;
  for (double l : row_loss) out.ce += l;
  for (double l : row_sq) out.lse_sq += l;
  return out;
}

// The loss's backward: dx_j = scale_i softmax_j - g [j = t], scale_i = g + gz2 lse_i (gz2 = 2 z_loss
// times the z-loss's upstream gradient; gz2 == 0: scale_i is g itself, the cross-entropy's gradient).
torch::Tensor ce_backward(const torch::Tensor& logits, const torch::Tensor& targets, const torch::Tensor& lse, float g,
                          float gz2) {
  const int64_t N = logits.size(0), V = logits.size(1);
  const float* px = logits.data_ptr<float>();
  const int64_t* pt = targets.data_ptr<int64_t>();
  const float* pl = lse.data_ptr<float>();
  auto dx = torch::empty_like(logits);
  float* pd = dx.data_ptr<float>();
  at::parallel_for(0, N, std::max<int64_t>(1, kGrain / V), [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      if (pt[i] < 0) {
        std::fill(pd + i * V, pd + (i + 1) * V, 0.0f);
        continue;
      }
      const float scale = gz2 == 0 ? g : g + gz2 * (pl[2 * i] + pl[2 * i + 1]);
      row_softmax(px + i * V, pd + i * V, V, pl + 2 * i, scale);
      pd[i * V + pt[i]] -= g;
    }
  });
  return dx;
}

struct CrossEntropySum : torch::autograd::Function<CrossEntropySum> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& logits,
                               const torch::Tensor& targets) {
    RECORD_FUNCTION("lm::cross_entropy_sum", std::vector<c10::IValue>({logits, targets}));
    auto lse = torch::zeros({logits.size(0), 2}, logits.options());  // per row: m, log sum exp(x - m)
    const LossSums sums = ce_forward(logits, targets, lse, /*with_z=*/false);
    ctx->save_for_backward({logits, targets, lse});
    return torch::scalar_tensor(sums.ce, logits.options());
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    RECORD_FUNCTION("lm::cross_entropy_sum_backward", std::vector<c10::IValue>({grads[0]}));
    auto saved = ctx->get_saved_variables();
    return {ce_backward(saved[0], saved[1], saved[2], grads[0].item<float>(), 0.0f), torch::Tensor()};
  }
};

// The same with the z-loss: (2,) [cross-entropy sum, z_loss x sum lse^2].
struct CrossEntropyZSum : torch::autograd::Function<CrossEntropyZSum> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& logits,
                               const torch::Tensor& targets, double z_loss) {
    RECORD_FUNCTION("lm::cross_entropy_z_sum", std::vector<c10::IValue>({logits, targets}));
    auto lse = torch::zeros({logits.size(0), 2}, logits.options());
    const LossSums sums = ce_forward(logits, targets, lse, /*with_z=*/true);
    ctx->save_for_backward({logits, targets, lse});
    ctx->saved_data["z_loss"] = z_loss;
    return torch::tensor({sums.ce, z_loss * sums.lse_sq}, torch::kDouble).to(logits.options());
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    RECORD_FUNCTION("lm::cross_entropy_z_sum_backward", std::vector<c10::IValue>({grads[0]}));
    auto saved = ctx->get_saved_variables();
    const auto g = grads[0].to(torch::kFloat).contiguous();  // (2,): the upstream gradients of both sums
    const float g_ce = g[0].item<float>(), g_z = g[1].item<float>();
    const float gz2 = static_cast<float>(2.0 * ctx->saved_data["z_loss"].toDouble() * g_z);
    return {ce_backward(saved[0], saved[1], saved[2], g_ce, gz2), torch::Tensor(), torch::Tensor()};
  }
};

// ---- Causal attention over a packed (B, T, 3C) q|k|v, one head at a time ----------------------
// BLAS's sgemm_ (column-major), found in the process (LibTorch's BLAS) rather than linked: a
// row-major C = op(A) op(B) is the column-major C^T = op(B)^T op(A)^T.
using SgemmFn = void (*)(const char*, const char*, const int*, const int*, const int*, const float*, const float*,
                         const int*, const float*, const int*, const float*, float*, const int*);

SgemmFn sgemm() {
  static const SgemmFn fn = reinterpret_cast<SgemmFn>(::dlsym(RTLD_DEFAULT, "sgemm_"));
  return fn;
}

// Row-major C (M x N, ldc) = alpha op(A) op(B) + beta C; op(A) is M x K, op(B) is K x N.
void gemm(bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda, const float* B, int ldb,
          float beta, float* C, int ldc) {
  const char a = ta ? 'T' : 'N', b = tb ? 'T' : 'N';
  sgemm()(&b, &a, &N, &M, &K, &alpha, B, &ldb, A, &lda, &beta, C, &ldc);
}

// Row i of an L x L block of S (rows ld apart) -> the softmax of its first i + 1 entries, zeros
// after (to the block's edge).
void causal_softmax_rows(float* S, int L, int ld) {
  for (int i = 0; i < L; ++i) {
    float* row = S + static_cast<int64_t>(i) * ld;
    float m_logs[2];
    row_lse(row, i + 1, m_logs);
    row_softmax(row, row, i + 1, m_logs, 1.0f);
    std::fill(row + i + 1, row + L, 0.0f);
  }
}

struct Heads {  // where head h of sequence b lives in the packed tensors
  int64_t T, C, hd;
  int64_t qkv(int64_t b, int64_t h) const { return b * T * 3 * C + h * hd; }  // q; k at +C, v at +2C
  int64_t out(int64_t b, int64_t h) const { return b * T * C + h * hd; }
};

// The attention's blocks per row: the documents' first positions and T, from doc_start (B, T)
// (models/lm.h's DocMask::start: a document begins where start[i] == i); empty: [0, T), one block.
std::vector<std::vector<int>> document_blocks(const torch::Tensor& doc_start, int64_t B, int64_t T) {
  std::vector<std::vector<int>> rows(static_cast<size_t>(B));
  const int64_t* st = doc_start.numel() > 0 ? doc_start.data_ptr<int64_t>() : nullptr;
  for (int64_t b = 0; b < B; ++b) {
    auto& r = rows[static_cast<size_t>(b)];
    r.push_back(0);
    for (int64_t i = 1; st && i < T; ++i)
      if (st[b * T + i] == i) r.push_back(static_cast<int>(i));
    r.push_back(static_cast<int>(T));
  }
  return rows;
}

struct CausalAttentionQKV : torch::autograd::Function<CausalAttentionQKV> {
  // doc_start: empty (an autograd Function's tensor argument must be defined), or (B, T) int64
  // (data.doc_mask): each document is a block of its own,
  // causal inside, and the products outside the blocks are never computed. One block [0, T) is
  // the same calls, the same bits, as the plain causal attention.
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& qkv, int64_t n_head,
                               const torch::Tensor& doc_start) {
    RECORD_FUNCTION("lm::causal_attention", std::vector<c10::IValue>({qkv}));
    const int64_t B = qkv.size(0), T = qkv.size(1), C = qkv.size(2) / 3, hd = C / n_head;
    const Heads at{T, C, hd};
    const auto blocks = document_blocks(doc_start, B, T);
    auto y = torch::empty({B, T, C}, qkv.options());
    // Attention weights, kept for backward: (B*H, T, T), written only in the documents' blocks.
    auto P = torch::empty({B * n_head, T, T}, qkv.options());
    const float* x = qkv.data_ptr<float>();
    float *py = y.data_ptr<float>(), *pp = P.data_ptr<float>();
    const int t = static_cast<int>(T), d = static_cast<int>(hd), ld = static_cast<int>(3 * C), ldy = static_cast<int>(C);
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
    // Heads in order on this thread, each product threaded by BLAS. (Heads spread over threads
    // with BLAS single-threaded won alone, 17 against 27 ms per layer, but made the training step
    // 2.5% slower than LibTorch's bmm path; this order made it 3% faster.)
    for (int64_t bh = 0; bh < B * n_head; ++bh) {
      const int64_t b = bh / n_head, h = bh % n_head;
      const auto& r = blocks[static_cast<size_t>(b)];
      for (size_t k = 0; k + 1 < r.size(); ++k) {  // the document [s, s + L)
        const int s = r[k], L = r[k + 1] - r[k];
        const float* q = x + at.qkv(b, h) + static_cast<int64_t>(s) * ld;
        float* S = pp + bh * T * T + static_cast<int64_t>(s) * t + s;
        gemm(false, true, L, L, d, scale, q, ld, q + C, ld, 0.0f, S, t);  // S = scale q k^T
        causal_softmax_rows(S, L, t);
        gemm(false, false, L, d, L, 1.0f, S, t, q + 2 * C, ld, 0.0f, py + at.out(b, h) + static_cast<int64_t>(s) * ldy,
             ldy);  // y = P v
      }
    }
    ctx->save_for_backward({qkv, P});
    ctx->saved_data["n_head"] = n_head;
    ctx->saved_data["doc_start"] = doc_start;
    return y;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    RECORD_FUNCTION("lm::causal_attention_backward", std::vector<c10::IValue>({grads[0]}));
    auto saved = ctx->get_saved_variables();
    const auto &qkv = saved[0], &P = saved[1];
    const int64_t n_head = ctx->saved_data["n_head"].toInt();
    const int64_t B = qkv.size(0), T = qkv.size(1), C = qkv.size(2) / 3, hd = C / n_head;
    const Heads at{T, C, hd};
    const auto blocks = document_blocks(ctx->saved_data["doc_start"].toTensor(), B, T);
    auto dy = grads[0].contiguous();
    auto dqkv = torch::empty_like(qkv);
    const float *x = qkv.data_ptr<float>(), *pp = P.data_ptr<float>(), *pdy = dy.data_ptr<float>();
    float* dx = dqkv.data_ptr<float>();
    const int t = static_cast<int>(T), d = static_cast<int>(hd), ld = static_cast<int>(3 * C), ldy = static_cast<int>(C);
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
    std::vector<float> dS(static_cast<size_t>(T * T));
    for (int64_t bh = 0; bh < B * n_head; ++bh) {
      const int64_t b = bh / n_head, h = bh % n_head;
      const auto& r = blocks[static_cast<size_t>(b)];
      for (size_t k = 0; k + 1 < r.size(); ++k) {  // the document [s, s + L); every row of dqkv is in one
        const int s = r[k], L = r[k + 1] - r[k];
        const int64_t s64 = s;
        const float *q = x + at.qkv(b, h) + s64 * ld, *S = pp + bh * T * T + s64 * t + s, *g = pdy + at.out(b, h) + s64 * ldy;
        float* dq = dx + at.qkv(b, h) + s64 * ld;
        gemm(true, false, L, d, L, 1.0f, S, t, g, ldy, 0.0f, dq + 2 * C, ld);       // dv = P^T dy
        gemm(false, true, L, L, d, 1.0f, g, ldy, q + 2 * C, ld, 0.0f, dS.data(), t);  // dP = dy v^T
        for (int64_t i = 0; i < L; ++i) {  // dS = P (dP - sum_j P dP), row by row; zero past i
          const float* p = S + i * T;
          float* row = dS.data() + i * T;
          float dot = 0;
          for (int64_t j = 0; j <= i; ++j) dot += p[j] * row[j];
          for (int64_t j = 0; j < L; ++j) row[j] = p[j] * (row[j] - dot);
        }
        gemm(false, false, L, d, L, scale, dS.data(), t, q + C, ld, 0.0f, dq, ld);  // dq = scale dS k
        gemm(true, false, L, d, L, scale, dS.data(), t, q, ld, 0.0f, dq + C, ld);   // dk = scale dS^T q
      }
    }
    return {dqkv, torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor gelu_tanh(const torch::Tensor& x) {
  if (!x.device().is_cpu() || x.scalar_type() != torch::kFloat || x.layout() != torch::kStrided)
    return torch::gelu(x, "tanh");
  auto xc = x.contiguous();
  if (!torch::GradMode::is_enabled() || !xc.requires_grad()) return gelu_tanh_forward(xc);
  return GeluTanh::apply(xc);
}

torch::Tensor cross_entropy_sum(const torch::Tensor& logits, const torch::Tensor& targets) {
  namespace F = torch::nn::functional;
  if (!logits.device().is_cpu() || logits.scalar_type() != torch::kFloat || logits.dim() != 2 ||
      targets.scalar_type() != torch::kLong || logits.layout() != torch::kStrided)
    return F::cross_entropy(logits, targets, F::CrossEntropyFuncOptions().ignore_index(-1).reduction(torch::kSum));
  TORCH_CHECK(targets.dim() == 1 && targets.size(0) == logits.size(0), "cross_entropy_sum: ", targets.sizes(),
              " targets for logits of ", logits.sizes());
  auto t = targets.contiguous();
  const int64_t* pt = t.data_ptr<int64_t>();
  for (int64_t i = 0; i < t.numel(); ++i)
    TORCH_CHECK(pt[i] >= -1 && pt[i] < logits.size(1), "Target ", pt[i], " is out of bounds.");
  return CrossEntropySum::apply(logits.contiguous(), t);
}

torch::Tensor cross_entropy_z_sum(const torch::Tensor& logits, const torch::Tensor& targets, double z_loss) {
  namespace F = torch::nn::functional;
  TORCH_CHECK(z_loss > 0, "cross_entropy_z_sum: z_loss must be > 0, got ", z_loss);
  if (!logits.device().is_cpu() || logits.scalar_type() != torch::kFloat || logits.dim() != 2 ||
      targets.scalar_type() != torch::kLong || logits.layout() != torch::kStrided) {
    auto ce = F::cross_entropy(logits, targets, F::CrossEntropyFuncOptions().ignore_index(-1).reduction(torch::kSum));
    const auto dtype = logits.scalar_type() == torch::kDouble ? torch::kDouble : torch::kFloat;  // at least fp32
    auto lse = torch::logsumexp(logits.to(dtype), 1);  // (N)
    auto z = z_loss * torch::where(targets.ne(-1), lse * lse, torch::zeros_like(lse)).sum();
    return torch::stack({ce.to(dtype), z});
  }
  TORCH_CHECK(targets.dim() == 1 && targets.size(0) == logits.size(0), "cross_entropy_z_sum: ", targets.sizes(),
              " targets for logits of ", logits.sizes());
  auto t = targets.contiguous();
  const int64_t* pt = t.data_ptr<int64_t>();
  for (int64_t i = 0; i < t.numel(); ++i)
    TORCH_CHECK(pt[i] >= -1 && pt[i] < logits.size(1), "Target ", pt[i], " is out of bounds.");
  return CrossEntropyZSum::apply(logits.contiguous(), t, z_loss);
}

const char* cpu_kernels_isa() {
#if defined(__x86_64__)
  if (has_avx2()) return "avx2";
#endif
  return "portable";
}

bool causal_attention_qkv_applies(const torch::Tensor& qkv) {
  return qkv.device().is_cpu() && qkv.scalar_type() == torch::kFloat && qkv.dim() == 3 &&
         qkv.layout() == torch::kStrided && sgemm() != nullptr;
}

torch::Tensor causal_attention_qkv(const torch::Tensor& qkv, int64_t n_head, const torch::Tensor& doc_start) {
  TORCH_CHECK(causal_attention_qkv_applies(qkv), "causal_attention_qkv: needs a CPU float32 (B, T, 3C) tensor and BLAS");
  TORCH_CHECK(qkv.size(2) % (3 * n_head) == 0, "causal_attention_qkv: ", qkv.size(2), " not 3 x ", n_head, " heads");
  if (!doc_start.defined()) return CausalAttentionQKV::apply(qkv.contiguous(), n_head, torch::empty({0}, torch::kLong));
  TORCH_CHECK(doc_start.device().is_cpu() && doc_start.scalar_type() == torch::kLong && doc_start.dim() == 2 &&
                  doc_start.size(0) == qkv.size(0) && doc_start.size(1) == qkv.size(1),
              "causal_attention_qkv: doc_start must be CPU int64 (B, T) = (", qkv.size(0), ", ", qkv.size(1), "), got ",
              doc_start.sizes());
  return CausalAttentionQKV::apply(qkv.contiguous(), n_head, doc_start.contiguous());
}

}  // namespace lm
