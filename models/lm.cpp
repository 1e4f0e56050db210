// The language-model interface's shared parts (see lm.h).
#include "models/lm.h"

#include "models/recompute.h"
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

torch::Tensor LMImpl::run_block(size_t i, std::function<torch::Tensor(const torch::Tensor&)> f, const torch::Tensor& x,
                                bool checkpoint, const torch::nn::Module& block) {
  if (unit_hooks) unit_hooks->before_forward(i);
  auto y = checkpoint ? recompute_block(std::move(f), x, block.parameters()) : f(x);
  if (unit_hooks) {
    unit_hooks->after_forward(i);
    if (y.requires_grad()) {
      std::weak_ptr<UnitHooks> hooks = unit_hooks;  // the graph may outlive whoever installed them
      y.register_hook([hooks, i](const torch::Tensor&) {
        if (auto h = hooks.lock()) h->before_backward(i);
      });
    }
  }
  return y;
}

void LMImpl::draw(const torch::Tensor& p, const WeightWriter& write, const std::function<void(torch::Tensor&)>& fill) {
  torch::NoGradGuard ng;
  if (!write) {
    torch::Tensor t = p;
    fill(t);
    return;
  }
  auto scratch = torch::empty(p.sizes(), torch::kFloat);
  fill(scratch);
  write(p, scratch);
}

torch::Tensor placeholder(at::IntArrayRef shape, const torch::Device& device) {
  return torch::zeros({}, torch::TensorOptions().dtype(torch::kFloat).device(device)).expand(shape);
}

bool is_placeholder(const torch::Tensor& t) {
  if (t.dim() == 0) return false;
  for (auto s : t.strides())
    if (s != 0) return false;
  return true;
}

void to_placeholders(torch::nn::Module& m, const torch::Device& device) {
  torch::NoGradGuard ng;
  for (auto& p : m.parameters()) p.set_data(placeholder(p.sizes(), device));
}

int64_t LMImpl::num_params() const {
  int64_t n = 0;
  for (const auto& p : parameters()) n += p.numel();
  return n;
}

DocMask doc_mask_of(const torch::Tensor& idx, int64_t eos) {
  const int64_t B = idx.size(0), T = idx.size(1);
  auto ar = torch::arange(T, idx.options().dtype(torch::kLong));
  DocMask m;
  // Position i starts a document when i = 0 or idx[i-1] is EOS; start[i] = the last such i' <= i.
  if (idx.device().is_cpu()) {  // one pass on the host (LibTorch 1.13's CPU cummax took ~0.5 ms a row)
    auto in = idx.to(torch::kLong).contiguous();
    m.start = torch::empty({B, T}, torch::kLong);
    const int64_t* x = in.data_ptr<int64_t>();
    int64_t* st = m.start.data_ptr<int64_t>();
    for (int64_t b = 0; b < B; ++b)
      for (int64_t i = 0, s = 0; i < T; ++i) {
        if (i > 0 && x[b * T + i - 1] == eos) s = i;
        st[b * T + i] = s;
      }
  } else {
    auto after_eos = torch::zeros(idx.sizes(), idx.options().dtype(torch::kBool));
    if (T > 1) after_eos.slice(1, 1, T).copy_(idx.slice(1, 0, T - 1) == eos);
    m.start = std::get<0>(torch::cummax(ar.expand_as(idx) * after_eos, 1));  // i where a document starts, else 0
  }
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
