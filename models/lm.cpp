// The language-model interface's shared parts (see lm.h).
#include "models/lm.h"

namespace lm {
namespace F = torch::nn::functional;
namespace {
torch::Tensor lm_loss(LMImpl& m, const torch::Tensor& idx, const torch::Tensor& targets,
                      F::CrossEntropyFuncOptions::reduction_t reduction) {
  auto logits = m.forward(idx, nullptr);
  return F::cross_entropy(logits.view({-1, logits.size(-1)}).to(torch::kFloat), targets.reshape({-1}),
                          F::CrossEntropyFuncOptions().ignore_index(-1).reduction(reduction));
}
}  // namespace

torch::Tensor LMImpl::loss(const torch::Tensor& idx, const torch::Tensor& targets) {
  return lm_loss(*this, idx, targets, torch::kMean);
}

torch::Tensor LMImpl::loss_sum(const torch::Tensor& idx, const torch::Tensor& targets) {
  return lm_loss(*this, idx, targets, torch::kSum);
}

int64_t LMImpl::num_params() const {
  int64_t n = 0;
  for (const auto& p : parameters()) n += p.numel();
  return n;
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
