// The fused LM head + cross-entropy (see head_loss.h).
#include "models/head_loss.h"

#include <cfloat>

#include "common/torch/compat.h"

namespace lm {
namespace {
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct HeadLoss : torch::autograd::Function<HeadLoss> {
  // Saves h, w (compute dtype), the softmax, the targets' columns, the valid rows and the targets'
  // logit gradients p_t - 1 (fp32).
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& hidden, const torch::Tensor& weight,
                               const torch::Tensor& targets, at::ScalarType dtype) {
    c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);  // the casts are ours
    auto h = hidden.to(dtype), w = weight.to(dtype);
    auto valid = targets.ne(-1);                // (N)
    auto col = targets.clamp_min(0).unsqueeze(1);  // (N, 1): an ignored row reads column 0
    auto probs = at::_softmax(at::mm(h, w.t()), 1, /*half_to_float=*/false);  // (N, V), logits freed
    auto p_t = probs.gather(1, col);          // (N, 1) in dtype
    probs.scatter_(1, col, 0);                // the other probabilities alone, summed in fp32 ...
    auto rest = probs.sum(1, /*keepdim=*/false, at::kFloat);
    probs.scatter_(1, col, p_t);              // ... and p_t back
    auto pt = p_t.squeeze(1).to(at::kFloat);
    auto near_one = pt > 0.5;
    auto row = at::where(near_one, at::log1p(-rest).neg(), pt.clamp_min(FLT_MIN).log().neg());
    auto loss = at::where(valid, row, at::zeros_like(row)).sum();
    auto d_t = at::where(near_one, rest.neg(), pt - 1);  // d loss / d logit_t
    ctx->save_for_backward({h, w, probs, col, valid, d_t});
    ctx->saved_data["hidden_dtype"] = static_cast<int64_t>(hidden.scalar_type());
    ctx->saved_data["weight_dtype"] = static_cast<int64_t>(weight.scalar_type());
    return loss;
  }

  // dlogits = softmax - one-hot, written into the saved softmax; ignored rows are left out of both
  // products by zeroing their rows of h (for dW) and of dh, (N, C) not (N, V) tensors.
  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
    auto s = ctx->get_saved_variables();
    const auto &h = s[0], &w = s[1], &col = s[3], &valid = s[4], &d_t = s[5];
    auto dlogits = s[2];
    const auto g = grad_outputs[0].to(at::kFloat);  // 0-dim
    const auto hidden_dtype = static_cast<at::ScalarType>(ctx->saved_data["hidden_dtype"].toInt());
    const auto weight_dtype = static_cast<at::ScalarType>(ctx->saved_data["weight_dtype"].toInt());
    dlogits.scatter_(1, col, d_t.unsqueeze(1).to(dlogits.scalar_type()));
    const auto keep = valid.unsqueeze(1);  // (N, 1)
    auto d_w = at::mm(dlogits.t(), h * keep.to(h.scalar_type())).to(weight_dtype).mul_(g);
    auto d_h = at::mm(dlogits, w).to(hidden_dtype).mul_(keep.to(at::kFloat) * g);
    return {d_h, d_w, torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor fused_head_loss_sum(const torch::Tensor& hidden, const torch::Tensor& weight, const torch::Tensor& targets) {
  TORCH_CHECK(hidden.dim() == 2 && weight.dim() == 2 && hidden.size(1) == weight.size(1) && targets.dim() == 1 &&
                  targets.size(0) == hidden.size(0),
              "fused_head_loss_sum: expected hidden (N, C), weight (V, C), targets (N); got ", hidden.sizes(), ", ",
              weight.sizes(), ", ", targets.sizes());
  const auto autocast = compat::autocast_dtype(hidden.device().type());
  const auto dtype = autocast ? *autocast : at::promote_types(hidden.scalar_type(), weight.scalar_type());
  return HeadLoss::apply(hidden, weight, targets, dtype);
}

}  // namespace lm
