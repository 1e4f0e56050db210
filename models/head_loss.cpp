// The fused LM head + cross-entropy (see head_loss.h).
#include "models/head_loss.h"

#include <algorithm>
#include <cfloat>

#include "common/torch/compat.h"

namespace lm {
namespace {
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct HeadLoss : torch::autograd::Function<HeadLoss> {
  // Saves h, w (compute dtype), the softmax, the targets' columns, the valid rows and the targets'
  // logit gradients p_t - 1 (fp32).
  // z_loss > 0: the output is (2,) [the loss, z_loss x the sum of lse^2 over the valid rows], and
  // the rows' lse (fp32) are saved too.
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& hidden, const torch::Tensor& weight,
                               const torch::Tensor& targets, at::ScalarType dtype, double z_loss) {
    c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);  // the casts are ours
    auto h = hidden.to(dtype), w = weight.to(dtype);
    auto valid = targets.ne(-1);                // (N)
    auto col = targets.clamp_min(0).unsqueeze(1);  // (N, 1): an ignored row reads column 0
    auto logits = at::mm(h, w.t());            // (N, V)
    const auto lse = z_loss > 0 ? rows_logsumexp(logits) : torch::Tensor();  // (N) fp32
    auto probs = at::_softmax(logits, 1, /*half_to_float=*/false);  // (N, V)
    logits = torch::Tensor();  // freed
    auto p_t = probs.gather(1, col);          // (N, 1) in dtype
    probs.scatter_(1, col, 0);                // the other probabilities alone, summed in fp32 ...
    auto rest = probs.sum(1, /*keepdim=*/false, at::kFloat);
    probs.scatter_(1, col, p_t);              // ... and p_t back
    auto pt = p_t.squeeze(1).to(at::kFloat);
    auto near_one = pt > 0.5;
    auto row = at::where(near_one, at::log1p(-rest).neg(), pt.clamp_min(FLT_MIN).log().neg());
    auto loss = at::where(valid, row, at::zeros_like(row)).sum();
    auto d_t = at::where(near_one, rest.neg(), pt - 1);  // d loss / d logit_t
    ctx->saved_data["hidden_dtype"] = static_cast<int64_t>(hidden.scalar_type());
    ctx->saved_data["weight_dtype"] = static_cast<int64_t>(weight.scalar_type());
    ctx->saved_data["z_loss"] = z_loss;
    if (z_loss > 0) {
      ctx->save_for_backward({h, w, probs, col, valid, d_t, lse});
      return at::stack({loss, at::where(valid, lse * lse, at::zeros_like(lse)).sum() * z_loss});
    }
    ctx->save_for_backward({h, w, probs, col, valid, d_t});
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
    const double z_loss = ctx->saved_data["z_loss"].toDouble();
    if (z_loss > 0) return backward_z(s, grad_outputs[0], z_loss, hidden_dtype, weight_dtype);
    dlogits.scatter_(1, col, d_t.unsqueeze(1).to(dlogits.scalar_type()));
    const auto keep = valid.unsqueeze(1);  // (N, 1)
    auto d_w = at::mm(dlogits.t(), h * keep.to(h.scalar_type())).to(weight_dtype).mul_(g);
    auto d_h = at::mm(dlogits, w).to(hidden_dtype).mul_(keep.to(at::kFloat) * g);
    return {d_h, d_w, torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }

  // With the z-loss, grad (2,) = [g, g_z]: a row's logit gradients are c (softmax) with
  // c = g + g_z 2 z_loss lse (fp32), the target's g d_t + (c - g) p_t; the scale goes into the saved
  // softmax (one more pass over it) instead of onto the products.
  static variable_list backward_z(const variable_list& s, const torch::Tensor& grad, double z_loss,
                                  at::ScalarType hidden_dtype, at::ScalarType weight_dtype) {
    const auto &h = s[0], &w = s[1], &col = s[3], &valid = s[4], &d_t = s[5], &lse = s[6];
    auto dlogits = s[2];
    const auto g2 = grad.to(at::kFloat);
    const auto g = g2[0], g_z = g2[1];                       // 0-dim
    const auto c = g + g_z * (2 * z_loss) * lse;             // (N) fp32
    const auto p_t = dlogits.gather(1, col).squeeze(1).to(at::kFloat);
    const auto target = g * d_t + (c - g) * p_t;             // (N) fp32
    dlogits.mul_(c.unsqueeze(1));                            // computed in fp32, stored in the compute dtype
    dlogits.scatter_(1, col, target.unsqueeze(1).to(dlogits.scalar_type()));
    const auto keep = valid.unsqueeze(1);  // (N, 1)
    auto d_w = at::mm(dlogits.t(), h * keep.to(h.scalar_type())).to(weight_dtype);
    auto d_h = at::mm(dlogits, w).to(hidden_dtype).mul_(keep.to(at::kFloat));
    return {d_h, d_w, torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }

  // log sum_j exp(logits_ij) in fp32, (N, V) in the compute dtype -> (N), a block of rows at a time: an
  // fp32 (rows, V) temporary of at most 64 MB, not (N, V).
  static torch::Tensor rows_logsumexp(const torch::Tensor& logits) {
    const int64_t N = logits.size(0), V = std::max<int64_t>(1, logits.size(1));
    const int64_t rows = std::max<int64_t>(1, (int64_t{1} << 24) / V);
    auto out = at::empty({N}, logits.options().dtype(at::kFloat));
    for (int64_t b = 0; b < N; b += rows) {
      const int64_t e = std::min(N, b + rows);
      out.slice(0, b, e).copy_(at::logsumexp(logits.slice(0, b, e).to(at::kFloat), {1}));
    }
    return out;
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
  return HeadLoss::apply(hidden, weight, targets, dtype, 0.0);
}

torch::Tensor fused_head_loss_z_sum(const torch::Tensor& hidden, const torch::Tensor& weight, const torch::Tensor& targets,
                                    double z_loss) {
  TORCH_CHECK(z_loss > 0, "fused_head_loss_z_sum: z_loss must be > 0, got ", z_loss);
  TORCH_CHECK(hidden.dim() == 2 && weight.dim() == 2 && hidden.size(1) == weight.size(1) && targets.dim() == 1 &&
                  targets.size(0) == hidden.size(0),
              "fused_head_loss_z_sum: expected hidden (N, C), weight (V, C), targets (N); got ", hidden.sizes(), ", ",
              weight.sizes(), ", ", targets.sizes());
  const auto autocast = compat::autocast_dtype(hidden.device().type());
  const auto dtype = autocast ? *autocast : at::promote_types(hidden.scalar_type(), weight.scalar_type());
  return HeadLoss::apply(hidden, weight, targets, dtype, z_loss);
}

}  // namespace lm
