// Flat parameters, gradient clipping, AdamW, LR schedule (see optim.h).
#include "trainer/optim/optim.h"

#include <cmath>

#include "common/compat.h"

namespace lm {

FlatParams::FlatParams(torch::nn::Module& module) {
  // Parameters owned by Embedding modules are not decayed.
  std::set<const void*> embedding_params;
  for (auto& m : module.named_modules()) {
    if (m.value()->as<torch::nn::Embedding>())
      for (auto& p : m.value()->parameters(false)) embedding_params.insert(p.unsafeGetTensorImpl());
  }
  auto named = module.named_parameters();
  std::vector<torch::Tensor> order;
  int64_t total = 0;
  for (auto it = named.end(); it != named.begin();) {  // reverse registration order
    --it;
    const auto& t = it->value();
    const bool decay = t.dim() >= 2 && !embedding_params.count(t.unsafeGetTensorImpl());
    entries_.push_back({it->key(), total, t.numel(), decay});
    if (!runs_.empty() && runs_.back().decay == decay) runs_.back().numel += t.numel();
    else runs_.push_back({"", total, t.numel(), decay});
    order.push_back(t);
    total += t.numel();
  }
  auto opts = named.size() ? named[0].value().options() : torch::TensorOptions();
  params_ = torch::empty({total}, opts.requires_grad(false));
  grads_ = torch::zeros({total}, opts.requires_grad(false));
  torch::NoGradGuard ng;
  for (size_t i = 0; i < order.size(); ++i) {
    auto& t = order[i];
    const auto& e = entries_[i];
    auto pv = params_.narrow(0, e.offset, e.numel).view(t.sizes());
    pv.copy_(t);
    t.set_data(pv);
    t.mutable_grad() = grads_.narrow(0, e.offset, e.numel).view(t.sizes());
  }
}

torch::Tensor clip_grad_norm(FlatParams& flat, double max_norm) {
  auto norm = flat.grads().norm();
  if (max_norm > 0) {
    auto coef = (max_norm / (norm + 1e-6)).clamp_max(1.0);
    flat.grads().mul_(coef);
  }
  return norm;
}

AdamW::AdamW(FlatParams& flat, const OptimConfig& cfg) : flat_(flat), cfg_(cfg) {
  m_ = torch::zeros_like(flat.params());
  v_ = torch::zeros_like(flat.params());
}

void AdamW::step(double lr) {
  ++t_;
  const double b1 = cfg_.beta1, b2 = cfg_.beta2, eps = cfg_.eps, wd = cfg_.weight_decay;
  const double bc1 = 1.0 - std::pow(b1, static_cast<double>(t_));
  const double bc2 = 1.0 - std::pow(b2, static_cast<double>(t_));
  const double step_size = lr / bc1, bc2_sqrt = std::sqrt(bc2);
  auto& p = flat_.params();
  auto& g = flat_.grads();
  if (p.is_cpu() && p.scalar_type() == torch::kFloat) {
    float* pp = p.data_ptr<float>();
    const float* gp = g.data_ptr<float>();
    float* mp = m_.data_ptr<float>();
    float* vp = v_.data_ptr<float>();
    const float fb1 = b1, fb2 = b2, omb1 = 1 - b1, omb2 = 1 - b2, feps = eps, fss = step_size,
                finv_bc2 = 1.0 / bc2_sqrt;
    for (const auto& run : flat_.decay_runs()) {
      const float fdecay = run.decay ? 1.0 - lr * wd : 1.0f;
      at::parallel_for(run.offset, run.offset + run.numel, 1 << 15, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) {
          float mi = fb1 * mp[i] + omb1 * gp[i];
          float vi = fb2 * vp[i] + omb2 * gp[i] * gp[i];
          mp[i] = mi;
          vp[i] = vi;
          pp[i] = pp[i] * fdecay - fss * mi / (std::sqrt(vi) * finv_bc2 + feps);
        }
      });
    }
    return;
  }
  torch::NoGradGuard ng;
  if (p.is_cuda()) {  // one fused kernel per decay group where LibTorch has it
    if (steps_.empty())
      for (size_t i = 0; i < flat_.decay_runs().size(); ++i)
        steps_.push_back(torch::full({}, static_cast<double>(t_ - 1), p.options().dtype(torch::kFloat)));
    bool fused = true;
    for (int decay = 0; decay < 2 && fused; ++decay) {
      std::vector<torch::Tensor> ps, gs, ms, vs, ts;
      for (size_t i = 0; i < flat_.decay_runs().size(); ++i) {
        const auto& run = flat_.decay_runs()[i];
        if (run.decay != (decay == 1)) continue;
        ps.push_back(p.narrow(0, run.offset, run.numel));
        gs.push_back(g.narrow(0, run.offset, run.numel));
        ms.push_back(m_.narrow(0, run.offset, run.numel));
        vs.push_back(v_.narrow(0, run.offset, run.numel));
        ts.push_back(steps_[i]);
      }
      if (!ps.empty()) fused = compat::fused_adamw(ps, gs, ms, vs, ts, lr, b1, b2, decay ? wd : 0.0, eps);
    }
    if (fused) return;
  }
  if (wd > 0)
    for (const auto& run : flat_.decay_runs())
      if (run.decay) p.narrow(0, run.offset, run.numel).mul_(1.0 - lr * wd);
  m_.mul_(b1).add_(g, 1 - b1);
  v_.mul_(b2).addcmul_(g, g, 1 - b2);
  p.addcdiv_(m_, (v_.sqrt() / bc2_sqrt).add_(eps), -step_size);
}

double lr_at(const ScheduleConfig& s, double peak_lr, int64_t max_steps, int64_t step) {
  if (step < s.warmup_steps) return peak_lr * static_cast<double>(step + 1) / s.warmup_steps;
  if (s.kind == "constant") return peak_lr;
  const int64_t end = s.decay_steps > 0 ? s.decay_steps : max_steps;
  const double min_lr = peak_lr * s.min_lr_ratio;
  if (step >= end || end <= s.warmup_steps) return min_lr;
  double frac = static_cast<double>(step - s.warmup_steps) / static_cast<double>(end - s.warmup_steps);
  double k = s.kind == "cosine" ? 0.5 * (1.0 + std::cos(M_PI * frac)) : 1.0 - frac;
  return min_lr + (peak_lr - min_lr) * k;
}

}  // namespace lm
