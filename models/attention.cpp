// Causal self-attention (see attention.h).
#include "models/attention.h"

#include <cmath>
#include <limits>
#include <tuple>

#include "common/torch/compat.h"
#include "models/cpu_kernels.h"
#include "models/lm.h"

namespace lm {
namespace {
std::string attention_shape_text(at::ScalarType dtype, const torch::Device& device, int64_t B, int64_t H, int64_t T, int64_t hd) {
  return std::string(c10::toString(dtype)) + ", " + device.str() + ", B=" + std::to_string(B) + " H=" + std::to_string(H) +
         " T=" + std::to_string(T) + " hd=" + std::to_string(hd);
}
}  // namespace

torch::Tensor doc_attention_mask(const DocMask& docs) {
  const int64_t B = docs.start.size(0), T = docs.start.size(1);
  auto ar = torch::arange(T, docs.start.options());
  auto j = ar.view({1, 1, 1, T});
  return (j <= ar.view({1, 1, T, 1})).logical_and(j >= docs.start.view({B, 1, T, 1}));  // (B, 1, T, T)
}

torch::Tensor causal_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                               double dropout_p, bool train, const DocMask* docs) {
  const bool masked = docs && docs->defined();
  if (k.size(-2) != q.size(-2)) {  // the last T of S positions (a KV cache): mask offset by S - T
    TORCH_CHECK(!masked, "causal_attention: no document mask with a KV cache");
    const int64_t T = q.size(-2), S = k.size(-2);
    auto att = torch::matmul(q * (1.0 / std::sqrt(static_cast<double>(q.size(-1)))), k.transpose(-2, -1));
    if (T > 1)
      att.masked_fill_(torch::ones({T, S}, torch::TensorOptions().dtype(torch::kBool).device(q.device())).triu(S - T + 1),
                       -std::numeric_limits<float>::infinity());
    return torch::matmul(torch::softmax(att, -1), v);
  }
  if constexpr (compat::kHasSdpa) {
    if (masked) return compat::sdpa_masked(q, k, v, doc_attention_mask(*docs), train ? dropout_p : 0.0);
    return compat::sdpa_causal(q, k, v, train ? dropout_p : 0.0);
  }
  const int64_t B = q.size(0), H = q.size(1), T = q.size(2), hd = q.size(3);
  torch::Tensor bias;  // (B*H, T, T), 0 where attended, -inf elsewhere
  if (masked) {
    bias = torch::zeros({B, 1, T, T}, q.options())
               .masked_fill_(doc_attention_mask(*docs).logical_not(), -std::numeric_limits<float>::infinity())
               .expand({B, H, T, T})
               .reshape({B * H, T, T});
  } else {
    thread_local torch::Tensor causal;  // (T, T): 0 on and below the diagonal, -inf above
    if (!causal.defined() || causal.size(0) < T || causal.device() != q.device())
      causal = torch::full({T, T}, -std::numeric_limits<float>::infinity(), q.options()).triu(1);
    auto b = causal.size(0) == T ? causal : causal.slice(0, 0, T).slice(1, 0, T);
    bias = b.to(q.scalar_type()).expand({B * H, T, T});
  }
  // One BLAS call per head does the scale (alpha) and the mask (beta = 1 on the copied bias).
  auto att = torch::baddbmm(bias, q.reshape({B * H, T, hd}), k.reshape({B * H, T, hd}).transpose(1, 2), 1.0,
                            1.0 / std::sqrt(static_cast<double>(hd)));
  att = torch::softmax(att, -1);
  if (train && dropout_p > 0) att = torch::dropout(att, dropout_p, true);
  return torch::bmm(att, v.reshape({B * H, T, hd})).view({B, H, T, hd});
}

torch::Tensor causal_self_attention(const torch::Tensor& qkv, int64_t n_head, double dropout_p, bool train,
                                    KVCache* cache, size_t layer, const DocMask* docs) {
  const int64_t B = qkv.size(0), T = qkv.size(1), C = qkv.size(2) / 3, hd = C / n_head;
  const bool masked = docs && docs->defined();
  if (!cache && !compat::kHasSdpa && !(train && dropout_p > 0) && causal_attention_qkv_applies(qkv))
    return causal_attention_qkv(qkv, n_head, masked ? docs->start : torch::Tensor());
  auto parts = qkv.split(C, 2);  // 3 x (B, T, C)
  auto heads = [&](const torch::Tensor& t) { return t.view({B, T, n_head, hd}).transpose(1, 2); };
  auto k = heads(parts[1]), v = heads(parts[2]);
  if (cache) std::tie(k, v) = cache_append(cache, layer, k, v);
  auto y = causal_attention(heads(parts[0]), k, v, dropout_p, train, docs);  // (B, H, T, hd)
  return merge_heads(y);
}

torch::Tensor merge_heads(const torch::Tensor& y) {
  const int64_t B = y.size(0), H = y.size(1), T = y.size(2), hd = y.size(3);
  auto t = y.transpose(1, 2);  // (B, T, H, hd)
  return t.is_contiguous() ? t.view({B, T, H * hd}) : t.reshape({B, T, H * hd});
}

std::string describe_attention(const ModelConfig& c, int64_t batch, at::ScalarType dtype, const torch::Device& device,
                               bool train, bool doc_mask) {
  const int64_t B = batch, T = c.seq_len, C = c.d_model, H = c.n_head, hd = C / H;
  const bool packed = c.arch == "gpt";  // GPT: q, k, v are views of one (B, T, 3C) projection
  const double p = train && packed ? c.dropout : 0.0;
  const auto opts = torch::TensorOptions().dtype(dtype).device(device);
  const std::string shape = attention_shape_text(dtype, device, B, H, T, hd);
  if (!compat::kHasSdpa) {
    auto qkv = torch::empty({1, 1, 3 * C}, opts);
    if (packed && !(train && p > 0) && causal_attention_qkv_applies(qkv))
      return std::string("attention: the fused CPU kernel") + (doc_mask ? ", one document block at a time" : "") +
             " (models/cpu_kernels.h; " + shape + "), output (B,T,C) without a copy";
    return std::string("attention: the plain kernel") + (doc_mask ? " with the documents' -inf bias" : "") +
           " (LibTorch " + compat::torch_version() + " has no SDPA; " + shape + "), output (B,T,C) by a copy";
  }
  torch::Tensor q, k, v;
  if (packed) {
    auto parts = torch::zeros({B, T, 3 * C}, opts).split(C, 2);
    auto heads = [&](const torch::Tensor& t) { return t.view({B, T, H, hd}).transpose(1, 2); };
    q = heads(parts[0]), k = heads(parts[1]), v = heads(parts[2]);
  } else {  // Llama: q after the rotation, k and v with the key/value heads repeated (contiguous)
    q = torch::zeros({B, T, H, hd}, opts).transpose(1, 2);
    k = torch::zeros({B, H, T, hd}, opts), v = torch::zeros({B, H, T, hd}, opts);
  }
  for (auto* t : {&q, &k, &v}) t->requires_grad_(train);
  // With doc_mask: one document per row (the mask's shape is what picks the kernel, not its contents).
  const DocMask docs = doc_mask ? doc_mask_of(torch::zeros({B, T}, torch::TensorOptions().dtype(torch::kLong).device(device)), 1)
                                : DocMask{};
  const int64_t choice = compat::sdpa_choice(q, k, v, p, doc_mask ? doc_attention_mask(docs) : torch::Tensor());
  static const char* const names[] = {"the math kernel", "flash attention", "memory-efficient attention",
                                      "cuDNN attention", "an overrideable backend"};
  const std::string name = choice >= 0 && choice <= 4 ? names[choice] : "backend " + std::to_string(choice);
  const auto y = causal_attention(q, k, v, p, train, &docs);
  const bool view = merge_heads(y).data_ptr() == y.data_ptr();  // what the model's merge does
  return "attention: " + name + (doc_mask ? " with the documents' boolean mask" : "") + " (at::_fused_sdp_choice = " + std::to_string(choice) + "; " + shape + "), output (B,T,C) " +
         (view ? "without a copy" : "by a copy");
}

}  // namespace lm
