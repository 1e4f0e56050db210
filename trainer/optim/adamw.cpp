// Flat parameters, gradient clipping, AdamW (see adamw.h).
#include "trainer/optim/adamw.h"

#include <cmath>
#include <cstdio>
#include <map>
#include <set>

#include "common/torch/compat.h"
#include "common/errors.h"
#include "common/log.h"
#include "trainer/optim/flat_state.h"

namespace lm {

void adam_update(torch::Tensor w, const torch::Tensor& g, torch::Tensor m, torch::Tensor v, double b1, double b2,
                 double eps, double step_size, double bc2_sqrt) {
  m.mul_(b1).add_(g, 1 - b1);
  v.mul_(b2).addcmul_(g, g, 1 - b2);
  w.addcdiv_(m, (v.sqrt() / bc2_sqrt).add_(eps), -step_size);
}

AdamW::AdamW(FlatParams& flat, const OptimConfig& cfg, std::optional<std::vector<FlatRange>> owned)
    : flat_(flat), cfg_(cfg), owned_(owned ? std::move(*owned) : std::vector<FlatRange>{{0, flat.numel()}}),
      sharded_(owned.has_value()) {
  TORCH_CHECK(!(sharded_ && flat.path().free_grads), "AdamW: sharded moments need the flat gradient buffer");
  int64_t state = 0;  // the owned ranges cut where the decay runs change
  for (const auto& r : owned_) {
    for (const auto& run : flat.decay_runs()) {
      const int64_t a = std::max(r.offset, run.offset), b = std::min(r.offset + r.numel, run.offset + run.numel);
      if (a < b) segments_.push_back({a, b - a, state + (a - r.offset), run.decay});
    }
    state += r.numel;
  }
  // Gradients in pieces (GradPath::pieces): packed as the moments are, the owned ranges one after another.
  TORCH_CHECK(!flat.path().pieces || (sharded_ && flat.grad_pieces().numel() == state),
              "AdamW: gradients in pieces need the same owned ranges as the moments");
  m_ = torch::zeros({state}, flat.options());
  v_ = torch::zeros({state}, flat.options());
  fused_ = resolve_fused(cfg, flat.options().device().is_cuda());
  TORCH_CHECK(fused_ || !(flat.path().free_grads || flat.path().clip_in_step),
              "AdamW: free or in-step clipped gradients need the fused AdamW (resolve_grad_path refuses them)");
}

void AdamW::step(double lr, const torch::Tensor& found_inf) {
  if (fence_) fence_->before_write();
  auto& p = flat_.params();
  if (fused_) return fused_step(lr, found_inf);
  if (found_inf.defined() && found_inf.item<float>() != 0) return;  // a host read off the fused path
  ++t_;
  const double b1 = cfg_.beta1, b2 = cfg_.beta2, eps = cfg_.eps, wd = cfg_.weight_decay;
  const double bc1 = 1.0 - std::pow(b1, static_cast<double>(t_));
  const double bc2 = 1.0 - std::pow(b2, static_cast<double>(t_));
  const double step_size = lr / bc1, bc2_sqrt = std::sqrt(bc2);
  // The gradients: the flat buffer (indexed as the weights), or packed as the moments (pieces).
  const bool packed = flat_.path().pieces;
  const torch::Tensor& g = packed ? flat_.grad_pieces() : flat_.grads();
  if (p.is_cpu() && p.scalar_type() == torch::kFloat) {
    float* pp = p.data_ptr<float>();
    const float* gp = g.data_ptr<float>();
    float* mp = m_.data_ptr<float>();
    float* vp = v_.data_ptr<float>();
    const float fb1 = b1, fb2 = b2, omb1 = 1 - b1, omb2 = 1 - b2, feps = eps, fss = step_size,
                finv_bc2 = 1.0 / bc2_sqrt;
    for (const auto& seg : segments_) {  // unsharded: the decay runs, moments at the same offsets
      const float fdecay = seg.decay ? 1.0 - lr * wd : 1.0f;
      const int64_t shift = seg.state_offset - seg.offset;  // flat index -> moment index
      const int64_t gshift = packed ? shift : 0;  // flat index -> gradient index
      const int64_t pshift = flat_.weight_index(seg.offset) - seg.offset;  // flat index -> weight index
      at::parallel_for(seg.offset, seg.offset + seg.numel, 1 << 15, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) {
          const int64_t j = i + shift;
          float mi = fb1 * mp[j] + omb1 * gp[i + gshift];
          float vi = fb2 * vp[j] + omb2 * gp[i + gshift] * gp[i + gshift];
          mp[j] = mi;
          vp[j] = vi;
          pp[i + pshift] = pp[i + pshift] * fdecay - fss * mi / (std::sqrt(vi) * finv_bc2 + feps);
        }
      });
    }
    return;
  }
  torch::NoGradGuard ng;
  if (wd > 0)
    for (const auto& seg : segments_)
      if (seg.decay) p.narrow(0, flat_.weight_index(seg.offset), seg.numel).mul_(1.0 - lr * wd);
  int64_t state = 0;
  for (const auto& r : owned_) {  // unsharded: one range, the whole buffer
    adam_update(p.narrow(0, flat_.weight_index(r.offset), r.numel), g.narrow(0, packed ? state : r.offset, r.numel),
                m_.narrow(0, state, r.numel), v_.narrow(0, state, r.numel), b1, b2, eps, step_size, bc2_sqrt);
    state += r.numel;
  }
}

// One at::_fused_adamw_ call per decay group (decayed matrices, the rest), over views of the flat
// buffers (one per decay run, or with free gradients one per parameter, its moments views of the
// flat ones, so the checkpoint's tensors stay the same); with clip_in_step the kernel divides the
// gradients by flat.grad_scale(). The kernel reads the step counter but does not increment it:
// Python's _fused_adam adds 1 first and, with found_inf, subtracts found_inf afterwards
// (torch/optim/adam.py), else the bias corrections of step 1 are 0 and every weight becomes NaN.
// Every tensor of the lists shares ONE counter (the kernel only reads it), not one counter per
// tensor or per run.
void AdamW::fused_step(double lr, const torch::Tensor& found_inf) {
  auto& p = flat_.params();
  torch::NoGradGuard ng;
  if (!step_.defined()) step_ = torch::full({}, static_cast<double>(t_), p.options().dtype(torch::kFloat));
  step_.add_(1);
  const bool free = flat_.path().free_grads;
  const auto grads = free ? flat_.grad_list() : std::vector<torch::Tensor>();
  for (int decay = 0; decay < 2; ++decay) {
    std::vector<torch::Tensor> ps, gs, ms, vs, ts;
    auto add = [&](int64_t offset, int64_t numel, int64_t state_offset, const torch::Tensor& g) {
      ps.push_back(p.narrow(0, flat_.weight_index(offset), numel));
      gs.push_back(g);
      ms.push_back(m_.narrow(0, state_offset, numel));
      vs.push_back(v_.narrow(0, state_offset, numel));
      ts.push_back(step_);
    };
    if (free) {
      const auto& entries = flat_.entries();
      for (size_t i = 0; i < entries.size(); ++i)
        if (entries[i].decay == (decay == 1)) add(entries[i].offset, entries[i].numel, entries[i].offset, grads[i].reshape({-1}));
    } else {
      for (const auto& seg : segments_)  // unsharded: the decay runs
        if (seg.decay == (decay == 1))
          add(seg.offset, seg.numel, seg.state_offset,
              flat_.path().pieces ? flat_.grad_pieces().narrow(0, seg.state_offset, seg.numel)
                                  : flat_.grads().narrow(0, seg.offset, seg.numel));
    }
    if (!ps.empty())
      compat::fused_adamw(ps, gs, ms, vs, ts, lr, cfg_.beta1, cfg_.beta2, decay ? cfg_.weight_decay : 0.0, cfg_.eps,
                          found_inf, flat_.grad_scale());
  }
  flat_.set_grad_scale({});  // applied (the kernel stores the divided gradients back)
  if (free) flat_.zero_grad();  // the update consumed them: their memory back before the next forward
  if (found_inf.defined()) step_.sub_(found_inf);
  ++t_;  // an upper bound while found_inf may have skipped steps; steps() reads the device truth
}

int64_t AdamW::steps() const { return step_.defined() ? static_cast<int64_t>(step_.item<float>()) : t_; }

ComponentState AdamW::state() const {
  ComponentState st;
  st.values = {{"kind", "adamw"}, {"step", steps()}};
  if (!sharded_) {
    for (const auto& e : flat_.entries()) {
      st.tensors.emplace_back("exp_avg/" + e.name, m_.narrow(0, e.offset, e.numel));
      st.tensors.emplace_back("exp_avg_sq/" + e.name, v_.narrow(0, e.offset, e.numel));
    }
    return st;
  }
  st.tensors = flat_slices(flat_, owned_, m_, "exp_avg/");
  for (auto& t : flat_slices(flat_, owned_, v_, "exp_avg_sq/")) st.tensors.push_back(std::move(t));
  return st;
}

// Copies what this rank owns of each whole or sliced moment tensor into the moments; *covered
// counts the values copied into each owned range (twice its numel once both moments are in).
void AdamW::load_tensors(const NamedTensors& ts, std::vector<int64_t>* covered) {
  for (const auto& [key, t] : ts) {
    FlatSlice s;
    if (parse_flat_slice(flat_, key, t, "exp_avg_sq/", "optimizer state", &s)) copy_flat_slice(owned_, v_, s, t, covered);
    else if (parse_flat_slice(flat_, key, t, "exp_avg/", "optimizer state", &s)) copy_flat_slice(owned_, m_, s, t, covered);
    else throw CheckpointError("optimizer state: unexpected tensor '" + key + "'");
  }
}

void AdamW::load_state(const ComponentState* in) {
  const ComponentState& st = *in;
  std::vector<int64_t> covered(owned_.size(), 0);
  load_tensors(st.tensors, &covered);
  for (const auto& read_shard : st.shards) load_tensors(read_shard(), &covered);  // one part in memory at a time
  check_flat_coverage(owned_, covered, 2, "moments");
  t_ = st.values.at("step").get<int64_t>();
  step_ = torch::Tensor();  // the fused kernel's device-side counter is rebuilt from t_
}

}  // namespace lm
