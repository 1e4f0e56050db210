// Flat parameters, gradient paths and clipping (see flat_params.h).
#include "trainer/optim/flat_params.h"

#include <algorithm>

#include "common/torch/compat.h"
#include "common/errors.h"
#include "common/log.h"
#include "models/lm.h"
#include "trainer/optim/flat_norm.h"

namespace lm {

bool resolve_fused(const OptimConfig& cfg, bool cuda) {
  const OptimizerKind& kind = optimizer_kind(cfg.name);
  if (!kind.fused_kernel) {  // the row says: no fused kernel, whatever optim.fused says on "auto"
    if (cfg.fused == "on")
      throw ConfigError("key 'optim.fused': optim.name=" + cfg.name + " has no fused kernel; use auto or off");
    return false;
  }
  const bool has_kernel = cuda ? compat::kHasFusedAdamW : compat::kHasCpuFusedAdamW;
  if (cfg.fused == "on" && !has_kernel)
    throw ConfigError("key 'optim.fused': LibTorch " + compat::torch_version() + " has no at::_fused_adamw_ for " +
                      (cuda ? "CUDA (needs >= 2.1)" : "the CPU (needs >= 2.4)"));
  return cfg.fused == "on" || (cfg.fused == "auto" && cuda && has_kernel);
}

GradPath resolve_grad_path(const OptimConfig& cfg, bool cuda, int world, bool process_group) {
  // What the optimizer's row (optimizer_kinds()) says it does decides, never its name: an optimizer
  // that does not honour grad_scale is clipped in a pass of its own, one that cannot take freed
  // gradients gets the flat buffer.
  const OptimizerKind& kind = optimizer_kind(cfg.name);
  const bool fused = resolve_fused(cfg, cuda);
  auto needs_fused = [&](const char* key) {
    return ConfigError(std::string("key '") + key + "': on needs the fused AdamW, and optim.fused=" + cfg.fused +
                       " gives the flat update here (LibTorch " + compat::torch_version() + ", " +
                       (cuda ? "CUDA" : "CPU") + "); use auto or off");
  };
  auto cannot = [&](const char* key, const char* what) {
    return ConfigError(std::string("key '") + key + "': optim.name=" + cfg.name + " " + what + "; use auto or off");
  };
  GradPath path;
  const bool grad_sync = world > 1 || process_group;  // the flat buffer's buckets are all-reduced
  if (cfg.free_grads == "on" && !kind.free_grads) throw cannot("optim.free_grads", "does not work with freed gradients");
  if (cfg.free_grads == "on" && grad_sync)
    throw ConfigError("key 'optim.free_grads': on needs one rank without a process group (this run has " +
                      std::to_string(world) + (world > 1 ? "" : ", and dist.backend names one") +
                      "): data parallelism all-reduces the flat gradient buffer; use auto or off");
  if (cfg.free_grads == "on" && !fused) throw needs_fused("optim.free_grads");
  path.free_grads = kind.free_grads && (cfg.free_grads == "on" || (cfg.free_grads == "auto" && cuda && fused && !grad_sync));
  if (cfg.clip_in_step == "on" && !kind.grad_scale) throw cannot("optim.clip_in_step", "does not clip inside its step (no grad_scale)");
  if (cfg.clip_in_step == "on" && !fused) throw needs_fused("optim.clip_in_step");
  path.clip_in_step = kind.grad_scale && (cfg.clip_in_step == "on" || (cfg.clip_in_step == "auto" && cuda && fused));
  return path;
}

FlatParams::FlatParams(torch::nn::Module& module, GradPath path) : path_(path) {
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
  numel_ = total;
  options_ = opts.requires_grad(false);
  TORCH_CHECK(!path_.weight_pieces || path_.pieces, "FlatParams: weights in pieces need the gradients in pieces");
  // Weights in pieces: no buffer of every value (keep_weight_pieces allocates the kept ones).
  if (!path_.weight_pieces) params_ = torch::empty({total}, opts.requires_grad(false));
  const bool per_param = path_.free_grads || path_.pieces;
  if (!per_param) grads_ = torch::zeros({total}, opts.requires_grad(false));
  torch::NoGradGuard ng;
  for (size_t i = 0; i < order.size(); ++i) {
    auto& t = order[i];
    const auto& e = entries_[i];
    const bool placeholder = is_placeholder(t);
    written_.push_back(!placeholder);
    index_[t.unsafeGetTensorImpl()] = i;
    if (!path_.weight_pieces) {
      auto pv = params_.narrow(0, e.offset, e.numel).view(t.sizes());
      if (!placeholder) pv.copy_(t);
      t.set_data(pv);
    }
    if (per_param) t.mutable_grad().reset();
    else t.mutable_grad() = grads_.narrow(0, e.offset, e.numel).view(t.sizes());
    tensors_.push_back(t);
  }
}

void FlatParams::write(const torch::Tensor& param, const torch::Tensor& values, const std::vector<FlatRange>* keep) {
  auto it = index_.find(param.unsafeGetTensorImpl());
  TORCH_CHECK(it != index_.end(), "FlatParams::write: not one of the flat parameters");
  const auto& e = entries_[it->second];
  TORCH_CHECK(values.numel() == e.numel, "FlatParams::write: ", values.numel(), " values for '", e.name, "' (",
              e.numel, ")");
  torch::NoGradGuard ng;
  const auto v = values.reshape({-1});
  const std::vector<FlatRange> all = {{0, numel()}};
  for (const auto& r : keep ? *keep : all) {
    const int64_t a = std::max(r.offset, e.offset), b = std::min(r.offset + r.numel, e.offset + e.numel);
    if (a < b) params_.narrow(0, weight_index(a), b - a).copy_(v.narrow(0, a - e.offset, b - a));
  }
  written_[it->second] = 1;
}

void FlatParams::keep_weight_pieces(std::vector<FlatRange> ranges) {
  TORCH_CHECK(path_.weight_pieces, "FlatParams::keep_weight_pieces: needs GradPath::weight_pieces");
  TORCH_CHECK(!params_.defined(), "FlatParams::keep_weight_pieces: called twice");
  int64_t n = 0;
  for (const auto& r : ranges) weight_at_.push_back(n), n += r.numel;
  weight_ranges_ = std::move(ranges);
  params_ = torch::empty({n}, options_);
  torch::NoGradGuard ng;
  for (size_t i = 0; i < entries_.size(); ++i)  // values the parameters hold already (a module built whole)
    if (written_[i]) write(tensors_[i], tensors_[i].detach(), &weight_ranges_);
}

int64_t FlatParams::weight_index(int64_t offset) const {
  if (!path_.weight_pieces) return offset;
  auto it = std::upper_bound(weight_ranges_.begin(), weight_ranges_.end(), offset,
                             [](int64_t o, const FlatRange& r) { return o < r.offset; });
  TORCH_CHECK(it != weight_ranges_.begin(), "FlatParams::weight_index: value ", offset, " is not kept here");
  --it;
  TORCH_CHECK(offset < it->offset + it->numel, "FlatParams::weight_index: value ", offset, " is not kept here");
  return weight_at_[static_cast<size_t>(it - weight_ranges_.begin())] + (offset - it->offset);
}

std::vector<std::string> FlatParams::pending_names(size_t max) const {
  std::vector<std::string> out;
  for (size_t i = 0; i < entries_.size() && out.size() < max; ++i)
    if (!written_[i]) out.push_back(entries_[i].name);
  return out;
}

torch::Tensor& FlatParams::grads() {
  TORCH_CHECK(!path_.free_grads, "FlatParams::grads(): gradients are per parameter (optim.free_grads)");
  TORCH_CHECK(!path_.pieces, "FlatParams::grads(): the parallelism keeps the gradients of its pieces only");
  return grads_;
}

void FlatParams::keep_grad_pieces(std::vector<FlatRange> ranges) {
  TORCH_CHECK(path_.pieces, "FlatParams::keep_grad_pieces: needs GradPath::pieces");
  int64_t n = 0;
  for (const auto& r : ranges) n += r.numel;
  piece_ranges_ = std::move(ranges);
  pieces_ = torch::zeros({n}, options_);
}

std::vector<torch::Tensor> FlatParams::grad_list() {
  std::vector<torch::Tensor> out;
  out.reserve(tensors_.size());
  for (auto& t : tensors_) {
    if (!t.grad().defined()) t.mutable_grad() = torch::zeros_like(t);  // never with the flat buffer
    out.push_back(t.grad());
  }
  return out;
}

void FlatParams::zero_grad() {
  grad_scale_ = torch::Tensor();
  if (!path_.free_grads && !path_.pieces) {
    grads_.zero_();
    return;
  }
  for (auto& t : tensors_) t.mutable_grad().reset();
}

torch::Tensor flat_grad_norm(FlatParams& flat) {
  const bool free = flat.path().free_grads;
  TORCH_CHECK(!flat.path().pieces, "flat_grad_norm: gradients in pieces need the parallelism's norm");
  if (!flat.options().device().is_cpu()) return free ? compat::global_norm(flat.grad_list()) : flat.grads().norm();
  if (!free) return torch::full({}, FlatNorm::of(flat.grads()), flat.options());
  FlatNorm n;  // per-parameter gradients, fed at their offsets (an undefined one is zeros)
  n.reset();
  const auto& entries = flat.entries();
  auto& tensors = flat.tensors();
  for (size_t e = 0; e < entries.size(); ++e) {
    const auto& g = tensors[e].grad();
    if (g.defined()) n.add(entries[e].offset, g.contiguous().data_ptr<float>(), entries[e].numel);
  }
  return torch::full({}, n.result(), flat.options());
}

torch::Tensor clip_grad_norm(FlatParams& flat, double max_norm, torch::Tensor norm) {
  const bool free = flat.path().free_grads, pieces = flat.path().pieces;
  TORCH_CHECK(!pieces || norm.defined(), "clip_grad_norm: gradients in pieces need the parallelism's norm");
  const auto grads = free ? flat.grad_list() : std::vector<torch::Tensor>();
  if (!norm.defined()) norm = flat_grad_norm(flat);
  if (max_norm > 0 && flat.path().clip_in_step) {
    flat.set_grad_scale(((norm + 1e-6) / max_norm).clamp_min(1.0));  // the inverse of coef below
  } else if (max_norm > 0) {
    auto coef = (max_norm / (norm + 1e-6)).clamp_max(1.0);
    if (free) compat::foreach_mul_(grads, coef);
    else if (pieces) flat.grad_pieces().mul_(coef);
    else flat.grads().mul_(coef);
  }
  return norm;
}

}  // namespace lm
