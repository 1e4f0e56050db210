// Muon for the hidden matrices, AdamW's update for the rest (see muon.h).
#include "trainer/optim/muon.h"

#include <algorithm>
#include <cmath>

#include "common/errors.h"
#include "common/log.h"
#include "trainer/optim/adamw.h"
#include "trainer/optim/flat_state.h"

namespace lm {

torch::Tensor newton_schulz(const torch::Tensor& g, int64_t steps) {
  const double a = 3.4445, b = -4.7750, c = 2.0315;
  const bool tall = g.size(0) > g.size(1);
  torch::Tensor x = g / (g.norm() + 1e-7);
  if (tall) x = x.t();
  for (int64_t i = 0; i < steps; ++i) {
    const auto A = x.mm(x.t());
    const auto B = A * b + A.mm(A) * c;
    x = x * a + B.mm(x);
  }
  return tall ? x.t() : x;
}

Muon::Muon(FlatParams& flat, const OptimConfig& cfg, std::optional<std::vector<FlatRange>> owned)
    : flat_(flat), cfg_(cfg) {
  TORCH_CHECK(!flat.path().free_grads && !flat.path().clip_in_step,
              "Muon: freed or in-step clipped gradients (resolve_grad_path asks optimizer_kinds() first)");
  const std::vector<FlatRange> ranges = owned ? *owned : std::vector<FlatRange>{{0, flat.numel()}};
  const auto& entries = flat.entries();
  int64_t packed = 0, mom = 0, adam = 0;  // the owned ranges' values before this one; state so far
  size_t e = 0;
  for (const auto& r : ranges) {
    while (e < entries.size() && entries[e].offset + entries[e].numel <= r.offset) ++e;
    int64_t at = r.offset;
    for (; e < entries.size() && entries[e].offset < r.offset + r.numel; ++e) {
      const auto& en = entries[e];
      if (en.offset != at || en.offset + en.numel > r.offset + r.numel)
        throw Error(strf("optim.name=muon needs whole parameters, and this rank's flat values %lld..%lld cut '%s' "
                         "apart", (long long)r.offset, (long long)(r.offset + r.numel - 1), en.name.c_str()));
      const auto& t = flat.tensors()[e];
      Param q{en.offset, en.numel, flat.path().pieces ? packed + (en.offset - r.offset) : en.offset, 0};
      if (en.decay && t.dim() == 2) {
        q.rows = t.size(0), q.cols = t.size(1), q.state_offset = mom, mom += en.numel;
        matrices_.push_back({en.offset, en.numel});
      } else {
        q.state_offset = adam, adam += en.numel;
        others_.push_back({en.offset, en.numel});
      }
      params_.push_back(q);
      at += en.numel;
    }
    packed += r.numel;
  }
  TORCH_CHECK(!flat.path().pieces || flat.grad_pieces().numel() == packed,
              "Muon: gradients in pieces need the same owned ranges as the optimizer");
  mom_ = torch::zeros({mom}, flat.options());
  m_ = torch::zeros({adam}, flat.options());
  v_ = torch::zeros({adam}, flat.options());
}

int64_t Muon::state_bytes() const {
  return (mom_.numel() + m_.numel() + v_.numel()) * static_cast<int64_t>(mom_.element_size());
}

void Muon::step(double lr, const torch::Tensor& found_inf) {
  // Clipping is never left to this step: it has no grad_scale (optimizer_kinds()).
  TORCH_CHECK(!flat_.grad_scale().defined(), "Muon: a pending grad_scale would leave the update unclipped");
  if (fence_) fence_->before_write();
  if (found_inf.defined() && found_inf.item<float>() != 0) return;  // a skipped step changes nothing
  ++t_;
  torch::NoGradGuard ng;
  auto& p = flat_.params();
  const torch::Tensor& g = flat_.path().pieces ? flat_.grad_pieces() : flat_.grads();
  const double mu = cfg_.muon_momentum, wd = cfg_.weight_decay;
  const double lr_m = cfg_.muon_lr * lr / cfg_.lr;  // the schedule's factor on the matrices' own rate
  const double b1 = cfg_.beta1, b2 = cfg_.beta2;
  const double bc1 = 1.0 - std::pow(b1, static_cast<double>(t_)), bc2_sqrt = std::sqrt(1.0 - std::pow(b2, static_cast<double>(t_)));
  for (const auto& q : params_) {
    auto w = p.narrow(0, flat_.weight_index(q.offset), q.numel);
    const auto gr = g.narrow(0, q.grad_offset, q.numel);
    if (q.rows > 0) {
      auto buf = mom_.narrow(0, q.state_offset, q.numel);
      buf.mul_(mu).add_(gr);
      const auto u = gr.add(buf, mu);  // Nesterov
      const auto x = newton_schulz(u.view({q.rows, q.cols}), cfg_.muon_ns_steps);
      if (wd > 0) w.mul_(1.0 - lr_m * wd);
      w.add_(x.reshape({-1}), -lr_m * std::sqrt(std::max(1.0, static_cast<double>(q.rows) / static_cast<double>(q.cols))));
    } else {
      adam_update(w, gr, m_.narrow(0, q.state_offset, q.numel), v_.narrow(0, q.state_offset, q.numel), b1, b2, cfg_.eps,
                  lr / bc1, bc2_sqrt);
    }
  }
}

ComponentState Muon::state() const {
  ComponentState st;
  st.values = {{"kind", "muon"}, {"step", t_}};
  st.tensors = flat_slices(flat_, matrices_, mom_, "momentum/");
  for (auto& t : flat_slices(flat_, others_, m_, "exp_avg/")) st.tensors.push_back(std::move(t));
  for (auto& t : flat_slices(flat_, others_, v_, "exp_avg_sq/")) st.tensors.push_back(std::move(t));
  return st;
}

void Muon::load_state(const ComponentState* in) {
  const ComponentState& st = *in;
  const std::string kind = st.values.value("kind", std::string("adamw"));
  if (kind != "muon")
    throw CheckpointError("optimizer state: the checkpoint's optimizer is " + kind + ", this run's optim.name is muon");
  std::vector<int64_t> mats(matrices_.size(), 0), rest(others_.size(), 0);
  auto load = [&](const NamedTensors& ts) {
    for (const auto& [key, t] : ts) {
      FlatSlice s;
      if (parse_flat_slice(flat_, key, t, "momentum/", "optimizer state", &s)) copy_flat_slice(matrices_, mom_, s, t, &mats);
      else if (parse_flat_slice(flat_, key, t, "exp_avg_sq/", "optimizer state", &s)) copy_flat_slice(others_, v_, s, t, &rest);
      else if (parse_flat_slice(flat_, key, t, "exp_avg/", "optimizer state", &s)) copy_flat_slice(others_, m_, s, t, &rest);
      else throw CheckpointError("optimizer state: unexpected tensor '" + key + "'");
    }
  };
  load(st.tensors);
  for (const auto& read_shard : st.shards) load(read_shard());
  check_flat_coverage(matrices_, mats, 1, "Muon momentum");
  check_flat_coverage(others_, rest, 2, "AdamW moments");
  t_ = st.values.at("step").get<int64_t>();
}

}  // namespace lm
