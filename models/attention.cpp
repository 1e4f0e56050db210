// Causal self-attention (see attention.h).
#include "models/attention.h"

#include <cmath>
#include <limits>

#include "common/compat.h"

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
  const int64_t T = q.size(-2);
  thread_local torch::Tensor mask;  // (T, T) true above the diagonal
  if (!mask.defined() || mask.size(0) < T || mask.device() != q.device())
    mask = torch::ones({T, T}, torch::TensorOptions().dtype(torch::kBool).device(q.device())).triu(1);
  auto m = mask.size(0) == T ? mask : mask.slice(0, 0, T).slice(1, 0, T);
  auto att = torch::matmul(q * (1.0 / std::sqrt(static_cast<double>(q.size(-1)))), k.transpose(-2, -1));
  att.masked_fill_(m, -std::numeric_limits<float>::infinity());
  att = torch::softmax(att, -1);
  if (train && dropout_p > 0) att = torch::dropout(att, dropout_p, true);
  return torch::matmul(att, v);
}

}  // namespace lm
