// The language-model interface's shared parts (see lm.h).
#include "models/lm.h"

#include "models/cpu_kernels.h"
#include "models/head_loss.h"

namespace lm {
namespace {
// Summed over targets != -1 (models/cpu_kernels.h: fused on CPU float32, LibTorch's elsewhere).
torch::Tensor lm_loss_sum(LMImpl& m, const torch::Tensor& idx, const torch::Tensor& targets) {
  auto logits = m.forward(idx, nullptr);
  return cross_entropy_sum(logits.view({-1, logits.size(-1)}).to(torch::kFloat), targets.reshape({-1}));
}
}  // namespace

torch::Tensor LMImpl::forward(const torch::Tensor& idx, KVCache* cache) {
  return torch::nn::functional::linear(hidden(idx, cache), head_weight());  // (B, t, V)
}

torch::Tensor LMImpl::loss(const torch::Tensor& idx, const torch::Tensor& targets) {
  // LibTorch's mean over targets != -1: NaN (0/0) when every target is -1.
  return lm_loss_sum(*this, idx, targets) / (targets != -1).sum().to(torch::kFloat);
}

torch::Tensor LMImpl::loss_sum(const torch::Tensor& idx, const torch::Tensor& targets) {
  if (!numerics.fused_loss) return lm_loss_sum(*this, idx, targets);
  auto h = hidden(idx, nullptr);
  return fused_head_loss_sum(h.reshape({-1, h.size(-1)}), head_weight(), targets.reshape({-1}));
}

LossTerms LMImpl::loss_terms(const torch::Tensor& idx, const torch::Tensor& targets) {
  if (!(numerics.z_loss > 0)) return {loss_sum(idx, targets), torch::Tensor()};
  torch::Tensor both;  // (2,): [cross-entropy sum, z-loss sum]
  if (numerics.fused_loss) {
    auto h = hidden(idx, nullptr);
    both = fused_head_loss_z_sum(h.reshape({-1, h.size(-1)}), head_weight(), targets.reshape({-1}), numerics.z_loss);
  } else {
    auto logits = forward(idx, nullptr);
    both = cross_entropy_z_sum(logits.view({-1, logits.size(-1)}).to(torch::kFloat), targets.reshape({-1}),
                               numerics.z_loss);
  }
  return {both[0], both[1]};
}

int64_t LMImpl::num_params() const {
  int64_t n = 0;
  for (const auto& p : parameters()) n += p.numel();
  return n;
}

DocMask doc_mask_of(const torch::Tensor& idx, int64_t eos) {
  const int64_t T = idx.size(1);
  auto ar = torch::arange(T, idx.options().dtype(torch::kLong));
  // Position i starts a document when i = 0 or idx[i-1] is EOS; start[i] = the last such i' <= i.
  auto after_eos = torch::zeros(idx.sizes(), idx.options().dtype(torch::kBool));
  if (T > 1) after_eos.slice(1, 1, T).copy_(idx.slice(1, 0, T - 1) == eos);
  auto marks = ar.expand_as(idx) * after_eos;  // i where a document starts after an EOS, else 0
  DocMask m;
  m.start = std::get<0>(torch::cummax(marks, 1));
  m.pos = ar - m.start;
  return m;
}

std::pair<torch::Tensor, torch::Tensor> cache_append(KVCache* cache, size_t layer, torch::Tensor k, torch::Tensor v) {
  if (cache->k.size() <= layer) cache->k.resize(layer + 1), cache->v.resize(layer + 1);
  if (cache->k[layer].defined()) {
    k = torch::cat({cache->k[layer], k}, 2);
    v = torch::cat({cache->v[layer], v}, 2);
  }
  cache->k[layer] = k;
  cache->v[layer] = v;
  return {k, v};
}

}  // namespace lm
