// GPT-2 style decoder (see gpt.h).
#include "models/gpt.h"

#include <cmath>

#include "common/torch/compat.h"
#include "models/attention.h"
#include "models/recompute.h"
#include "models/cpu_kernels.h"

namespace lm {
namespace F = torch::nn::functional;
namespace {
// LayerNorm of x. x in a lower dtype than the weights (the bf16 residual stream): computed in x's
// dtype, with the weights cast to it and autocast's fp32 policy bypassed (ATen accumulates in fp32).
torch::Tensor gpt_norm(torch::nn::LayerNorm& ln, const torch::Tensor& x) {
  if (x.scalar_type() == ln->weight.scalar_type()) return ln->forward(x);
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
  const auto t = x.scalar_type();
  return F::layer_norm(x, F::LayerNormFuncOptions(ln->options.normalized_shape())
                              .weight(ln->weight.to(t)).bias(ln->bias.to(t)).eps(ln->options.eps()));
}
}  // namespace

BlockImpl::BlockImpl(const ModelConfig& c) : n_head(c.n_head), dropout(c.dropout) {
  const int64_t d = c.d_model;
  ln1 = register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d})));
  qkv = register_module("qkv", torch::nn::Linear(d, 3 * d));
  proj = register_module("proj", torch::nn::Linear(d, d));
  ln2 = register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d})));
  fc = register_module("fc", torch::nn::Linear(d, 4 * d));
  fc2 = register_module("fc2", torch::nn::Linear(4 * d, d));
}

torch::Tensor BlockImpl::forward(const torch::Tensor& x, KVCache* cache, size_t layer, const DocMask* docs) {
  auto packed = qkv->forward(gpt_norm(ln1, x));  // (B, T, 3C): q | k | v
  auto y = proj->forward(causal_self_attention(packed, n_head, dropout, is_training(), cache, layer, docs));
  auto h = x + F::dropout(y, F::DropoutFuncOptions().p(dropout).training(is_training() && dropout > 0));
  auto m = fc2->forward(gelu_tanh(fc->forward(gpt_norm(ln2, h))));
  return h + F::dropout(m, F::DropoutFuncOptions().p(dropout).training(is_training() && dropout > 0));
}

GPTImpl::GPTImpl(const ModelConfig& c, int64_t vocab_size, const torch::Device* deferred) : LMImpl(c, vocab_size) {
  wte = register_module("wte", torch::nn::Embedding(vocab_size, c.d_model));
  made(*wte, deferred);
  wpe = register_module("wpe", torch::nn::Embedding(c.seq_len, c.d_model));
  made(*wpe, deferred);
  blocks = register_module("blocks", torch::nn::ModuleList());
  for (int64_t i = 0; i < c.n_layer; ++i) {
    Block block(c);
    made(*block, deferred);
    blocks->push_back(block);
  }
  lnf = register_module("lnf", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.d_model})));
  made(*lnf, deferred);
  if (!deferred) init_weights(nullptr);
}

void GPTImpl::init_weights(const WeightWriter& write) {
  const double std = cfg.init_std, resid_std = cfg.init_std / std::sqrt(2.0 * cfg.n_layer);
  for (auto& p : named_parameters()) {
    const std::string& name = p.key();
    if (p.value().dim() == 1) {  // LayerNorm weights (the only 1-d weights) -> 1, every bias -> 0
      const bool weight = name.size() >= 6 && name.compare(name.size() - 6, 6, "weight") == 0;
      draw(p.value(), write, [weight](torch::Tensor& t) { weight ? t.fill_(1.0) : t.zero_(); });
    } else {
      const bool resid = name.find(".proj.weight") != std::string::npos || name.find(".fc2.weight") != std::string::npos;
      // torch::nn::init::normal_ is t.normal_(mean, std) inside LibTorch: called here, g++ 14 warned
      // (-Wmaybe-uninitialized, an error under LM_WERROR) about the std::optional<at::Generator>
      // default argument the inlined Tensor::normal_ destroys (LibTorch 2.6, in the unity TU). The
      // same draws either way.
      const double s = resid ? resid_std : std;
      draw(p.value(), write, [s](torch::Tensor& t) { torch::nn::init::normal_(t, 0.0, s); });
    }
  }
}

torch::Tensor GPTImpl::hidden(const torch::Tensor& idx, KVCache* cache) {
  const int64_t T = idx.size(1), P = cache ? cache->pos : 0;
  TORCH_CHECK(P + T <= cfg.seq_len, "sequence of ", P + T, " tokens exceeds model.seq_len=", cfg.seq_len);
  rest_used();
  const DocMask docs = doc_mask_now(idx, cache);  // data.doc_mask: positions restart at each document
  auto pos = docs.defined() ? docs.pos : torch::arange(P, P + T, torch::TensorOptions().dtype(torch::kLong).device(idx.device()));
  auto x = wte->forward(idx) + wpe->forward(pos);  // (B, T, C)
  if (numerics.bf16_residual)
    if (auto dtype = compat::autocast_dtype(idx.device().type())) x = x.to(*dtype);
  if (cfg.dropout > 0) x = F::dropout(x, F::DropoutFuncOptions().p(cfg.dropout).training(is_training()));
  const bool checkpoint = recompute_blocks_now(cache);
  for (size_t i = 0; i < blocks->size(); ++i) {
    auto block = blocks->ptr<BlockImpl>(i);
    x = run_block(i, [block, docs, cache, i](const torch::Tensor& in) { return block->forward(in, cache, i, &docs); }, x,
                  checkpoint, *block);
  }
  if (cache) cache->pos += T;
  return gpt_norm(lnf, x);
}

}  // namespace lm
