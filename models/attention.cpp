// Causal self-attention (see attention.h).
#include "models/attention.h"

#include <cmath>
#include <limits>
#include <tuple>

#include "common/torch/compat.h"
#include "models/cpu_kernels.h"
#include "models/lm.h"

namespace lm {

torch::Tensor causal_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                               double dropout_p, bool train) {
  if (k.size(-2) != q.size(-2)) {  // the last T of S positions (a KV cache): mask offset by S - T
    const int64_t T = q.size(-2), S = k.size(-2);
    auto att = torch::matmul(q * (1.0 / std::sqrt(static_cast<double>(q.size(-1)))), k.transpose(-2, -1));
    if (T > 1)
      att.masked_fill_(torch::ones({T, S}, torch::TensorOptions().dtype(torch::kBool).device(q.device())).triu(S - T + 1),
                       -std::numeric_limits<float>::infinity());
    return torch::matmul(torch::softmax(att, -1), v);
  }
  if constexpr (compat::kHasSdpa) return compat::sdpa_causal(q, k, v, train ? dropout_p : 0.0);
  const int64_t B = q.size(0), H = q.size(1), T = q.size(2), hd = q.size(3);
  thread_local torch::Tensor bias;  // (T, T): 0 on and below the diagonal, -inf above
  if (!bias.defined() || bias.size(0) < T || bias.device() != q.device())
    bias = torch::full({T, T}, -std::numeric_limits<float>::infinity(), q.options()).triu(1);
  auto b = bias.size(0) == T ? bias : bias.slice(0, 0, T).slice(1, 0, T);
  // One BLAS call per head does the scale (alpha) and the mask (beta = 1 on the copied bias).
  auto att = torch::baddbmm(b.to(q.scalar_type()).expand({B * H, T, T}), q.reshape({B * H, T, hd}),
                            k.reshape({B * H, T, hd}).transpose(1, 2), 1.0,
                            1.0 / std::sqrt(static_cast<double>(hd)));
  att = torch::softmax(att, -1);
  if (train && dropout_p > 0) att = torch::dropout(att, dropout_p, true);
  return torch::bmm(att, v.reshape({B * H, T, hd})).view({B, H, T, hd});
}

torch::Tensor causal_self_attention(const torch::Tensor& qkv, int64_t n_head, double dropout_p, bool train,
                                    KVCache* cache, size_t layer) {
  const int64_t B = qkv.size(0), T = qkv.size(1), C = qkv.size(2) / 3, hd = C / n_head;
  if (!cache && !compat::kHasSdpa && !(train && dropout_p > 0) && causal_attention_qkv_applies(qkv))
    return causal_attention_qkv(qkv, n_head);
  auto parts = qkv.split(C, 2);  // 3 x (B, T, C)
  auto heads = [&](const torch::Tensor& t) { return t.view({B, T, n_head, hd}).transpose(1, 2); };
  auto k = heads(parts[1]), v = heads(parts[2]);
  if (cache) std::tie(k, v) = cache_append(cache, layer, k, v);
  auto y = causal_attention(heads(parts[0]), k, v, dropout_p, train);  // (B, H, T, hd)
  return y.transpose(1, 2).contiguous().view({B, T, C});
}

}  // namespace lm
