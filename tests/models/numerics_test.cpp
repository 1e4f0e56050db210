// The trainer's numerics switches, models/ side and in real runs: the fused LM head + cross-entropy
// (models/head_loss.h, train.fused_loss) against the plain path and a float64 reference; the bf16
// residual stream (train.bf16_residual, LibTorch >= 2.4: CPU autocast); the attention start-up line
// (models/attention.h: describe_attention, merge_heads).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>

#include "common/torch/compat.h"
#include "models/attention.h"
#include "models/build.h"
#include "models/cpu_kernels.h"
#include "models/gpt.h"
#include "models/head_loss.h"
#include "models/llama.h"
#include "tests/testutil.h"

namespace lm {
namespace {
namespace F = torch::nn::functional;

// max |a - ref| / max |ref|: an error relative to the tensor's scale (the max-abs norm).
double nt_rel_err(const torch::Tensor& a, const torch::Tensor& ref) {
  auto r = ref.to(torch::kDouble);
  return (a.to(torch::kDouble) - r).abs().max().item<double>() / r.abs().max().item<double>();
}

struct NtCase {
  torch::Tensor h, w, t;  // (N, C), (V, C), (N)
};

// Logits h w^T of std ~0.25 x `scale`; targets: the row's argmax on even rows (p_t near 1 when
// scale is large), a random class on odd rows (p_t tiny), -1 on every 7th row.
NtCase nt_case(int64_t N, int64_t C, int64_t V, double scale, uint64_t seed) {
  torch::manual_seed(seed);
  NtCase k;
  k.h = torch::randn({N, C}) * scale;
  k.w = torch::randn({V, C}) * (0.25 / std::sqrt(static_cast<double>(C)));
  auto logits = torch::mm(k.h, k.w.t());
  k.t = torch::randint(0, V, {N}, torch::kLong);
  k.t.slice(0, 0, N, 2).copy_(logits.argmax(1).slice(0, 0, N, 2));
  k.t.slice(0, 3, N, 7).fill_(-1);
  return k;
}

struct NtResult {
  torch::Tensor loss, dh, dw;
};

// loss_fn(h, w, t) and its gradients for the upstream gradient 0.5 (the trainer's 1/tokens).
template <typename Fn>
NtResult nt_run(const torch::Tensor& h0, const torch::Tensor& w0, const torch::Tensor& t, Fn loss_fn) {
  auto h = h0.detach().clone().requires_grad_(true), w = w0.detach().clone().requires_grad_(true);
  auto loss = loss_fn(h, w, t);
  auto g = torch::autograd::grad({loss}, {h, w}, {torch::full({}, 0.5, loss.options())});
  return {loss.detach(), g[0], g[1]};
}

NtResult nt_reference(const torch::Tensor& h, const torch::Tensor& w, const torch::Tensor& t) {  // float64
  return nt_run(h.to(torch::kDouble), w.to(torch::kDouble), t, [](auto& a, auto& b, auto& c) {
    return F::cross_entropy(torch::mm(a, b.t()), c, F::CrossEntropyFuncOptions().ignore_index(-1).reduction(torch::kSum));
  });
}

NtResult nt_plain(const torch::Tensor& h, const torch::Tensor& w, const torch::Tensor& t) {  // today's path
  return nt_run(h, w, t, [](auto& a, auto& b, auto& c) { return cross_entropy_sum(F::linear(a, b).to(torch::kFloat), c); });
}

NtResult nt_fused(const torch::Tensor& h, const torch::Tensor& w, const torch::Tensor& t) {
  return nt_run(h, w, t, [](auto& a, auto& b, auto& c) { return fused_head_loss_sum(a, b, c); });
}

// fp32: the fused function equals the plain path (cross_entropy_sum on fp32 logits) and float64
// within 1e-5, loss and both gradients, with logits x50: p_t near 1 on some rows, tiny on others.
TEST(FusedHeadLoss, Fp32MatchesCrossEntropyWithIgnoredAndExtremeRows) {
  const auto k = nt_case(96, 16, 203, 50.0, 1);
  const auto ref = nt_reference(k.h, k.w, k.t);
  {  // the premise: extreme rows, none underflowing
    auto logits = torch::mm(k.h.to(torch::kDouble), k.w.to(torch::kDouble).t());
    auto valid = k.t.ne(-1);
    auto p = torch::softmax(logits, 1).gather(1, k.t.clamp_min(0).unsqueeze(1)).squeeze(1).index({valid});
    ASSERT_GT(p.max().item<double>(), 1 - 1e-4);
    ASSERT_LT(p.min().item<double>(), 1e-10);
    ASSERT_GT(p.min().item<double>(), 1e-37);  // above FLT_MIN: no clamp
  }
  const auto plain = nt_plain(k.h, k.w, k.t), fused = nt_fused(k.h, k.w, k.t);
  EXPECT_EQ(fused.loss.scalar_type(), torch::kFloat);
  EXPECT_EQ(fused.dh.scalar_type(), torch::kFloat);
  EXPECT_EQ(fused.dw.scalar_type(), torch::kFloat);
  for (auto* other : {&plain, &ref}) {
    const char* what = other == &ref ? "float64" : "cross_entropy_sum";
    EXPECT_NEAR(fused.loss.item<double>(), other->loss.item<double>(), 1e-5 * other->loss.item<double>()) << what;
    EXPECT_LT(nt_rel_err(fused.dh, other->dh), 1e-5) << what;
    EXPECT_LT(nt_rel_err(fused.dw, other->dw), 1e-5) << what;
  }
  auto ignored = k.t.eq(-1);  // ignored rows: no gradient at all
  EXPECT_TRUE(torch::equal(fused.dh.index({ignored}), torch::zeros({ignored.sum().item<int64_t>(), 16})));
}

// Rows whose target has p_t near 1: the loss is the small sum of the other probabilities
// (-log1p(-rest)), which -log(p_t) in float32 would round away, and the target's gradient -rest.
TEST(FusedHeadLoss, ConfidentRowsKeepTheirSmallLoss) {
  torch::manual_seed(2);
  const int64_t N = 64, V = 203;
  NtCase k;  // weight = I: the logits are hidden itself, exactly (no rounding of the product)
  k.w = torch::eye(V);
  k.h = torch::randn({N, V}) * 2;
  k.t = torch::randint(0, V, {N}, torch::kLong);
  auto top = std::get<0>(k.h.max(1));  // each target 12..16 above the row's other logits
  k.h.scatter_(1, k.t.unsqueeze(1), (top + 12 + torch::rand({N}) * 4).unsqueeze(1));
  const auto ref = nt_reference(k.h, k.w, k.t), fused = nt_fused(k.h, k.w, k.t);
  ASSERT_LT(ref.loss.item<double>(), 64 * 1e-2) << "the premise: confident rows";
  EXPECT_NEAR(fused.loss.item<double>(), ref.loss.item<double>(), 1e-5 * ref.loss.item<double>());
  EXPECT_LT(nt_rel_err(fused.dh, ref.dh), 1e-5);
  EXPECT_LT(nt_rel_err(fused.dw, ref.dw), 1e-5);
}

TEST(FusedHeadLoss, AllIgnoredIsZeroWithZeroGradients) {
  auto k = nt_case(8, 16, 64, 1.0, 3);
  auto r = nt_fused(k.h, k.w, torch::full({8}, -1, torch::kLong));
  EXPECT_EQ(r.loss.item<float>(), 0.0f);
  EXPECT_EQ(r.dh.abs().max().item<float>(), 0.0f);
  EXPECT_EQ(r.dw.abs().max().item<float>(), 0.0f);
}

// The standard deviation, relative to `loss`, of the error that rounding the logits h w^T to bf16
// gives the summed cross-entropy: each logit z is rounded to 8 significant bits, an error uniform
// within half an ulp (2^(floor(log2 |z|) - 7)), variance ulp^2 / 12, independent from logit to
// logit, which moves its row's loss by (p_j - [j = t]) times itself. Computed from the float64
// logits (of the bf16 inputs: their own rounding is in the reference too).
double bf16_logit_sigma(const torch::Tensor& h, const torch::Tensor& w, const torch::Tensor& t, double loss) {
  const auto valid = t.ne(-1);
  const auto z = torch::mm(h.to(torch::kDouble), w.to(torch::kDouble).t()).index({valid});
  const auto tv = t.index({valid}).unsqueeze(1);
  auto c = torch::softmax(z, 1);
  c.scatter_add_(1, tv, torch::full({tv.size(0), 1}, -1.0, c.options()));
  const auto ulp = torch::exp2(torch::floor(torch::log2(z.abs())) - 7);
  return std::sqrt((c.pow(2) * ulp.pow(2) / 12).sum().item<double>()) / loss;
}

// bf16 (LibTorch >= 2.4: the fp32 inputs under CPU autocast, as the trainer runs it; 1.13: bf16
// inputs without autocast) against float64, the reference computed from the bf16-rounded inputs.
// Logits of std ~2.5 (a trained LM's scale), some rows confident. The loss: what the bf16 logits
// give (the fp32 sums of C = 32 products inside the matmul add ~1e-7), six standard deviations
// (bf16_logit_sigma; every rounding the same way, the worst case, is never seen). The gradients
// (max-abs norm): each is rounded to bf16 once at the end (2^-9 of the largest, 2e-3) after a
// matmul of bf16-rounded dlogits (about as much again): 8e-3, twice that sum.
TEST(FusedHeadLoss, Bf16WithinTolerance) {
  auto k = nt_case(128, 32, 203, 10.0, 4);
  k.h.slice(0, 0, 16).mul_(2);  // confident rows (the even ones are on their argmax)
  auto hb = k.h.to(torch::kBFloat16), wb = k.w.to(torch::kBFloat16);
  const auto ref = nt_reference(hb, wb, k.t);
  // The same mode for the fused and today's path (bf16 logits, cast to fp32 for the loss).
  auto in_bf16 = [&](auto fn) {
    if (!compat::kHasCpuAutocast) return fn(hb, wb, k.t);
    compat::set_autocast(torch::Device(torch::kCPU), true);
    auto r = fn(hb.to(torch::kFloat), wb.to(torch::kFloat), k.t);
    compat::set_autocast(torch::Device(torch::kCPU), false);
    compat::clear_autocast_cache();
    return r;
  };
  const auto fused = in_bf16(nt_fused), plain = in_bf16(nt_plain);
  const auto grad_dtype = compat::kHasCpuAutocast ? torch::kFloat : torch::kBFloat16;  // the inputs' (fp32 master weights)
  EXPECT_EQ(fused.dh.scalar_type(), grad_dtype);
  EXPECT_EQ(fused.dw.scalar_type(), grad_dtype);
  const double want = ref.loss.item<double>();
  auto loss_err = [&](const NtResult& r) { return std::abs(r.loss.item<double>() - want) / want; };
  const double sigma = bf16_logit_sigma(hb, wb, k.t, want);
  EXPECT_LT(loss_err(fused), 6 * sigma);
  EXPECT_LT(nt_rel_err(fused.dh, ref.dh), 8e-3);
  EXPECT_LT(nt_rel_err(fused.dw, ref.dw), 8e-3);
  std::cerr << "bf16 logits' rounding: sigma " << sigma << " of the loss\n";
  std::cerr << "bf16 relative errors, fused: loss " << loss_err(fused) << ", dh " << nt_rel_err(fused.dh, ref.dh)
            << ", dw " << nt_rel_err(fused.dw, ref.dw) << "; plain: loss " << loss_err(plain) << ", dh "
            << nt_rel_err(plain.dh, ref.dh) << ", dw " << nt_rel_err(plain.dw, ref.dw) << "\n";
  // No less accurate than today's bf16 path (its error is the bf16 logits' and products').
  EXPECT_LE(loss_err(fused), 1.5 * loss_err(plain) + 1e-4);
  EXPECT_LE(nt_rel_err(fused.dh, ref.dh), 1.5 * nt_rel_err(plain.dh, ref.dh) + 1e-3);
  EXPECT_LE(nt_rel_err(fused.dw, ref.dw), 1.5 * nt_rel_err(plain.dw, ref.dw) + 1e-3);
  // It did compute in bf16 (an fp32 computation would be within 1e-5).
  EXPECT_GT(std::abs(nt_rel_err(fused.dw, ref.dw)), 1e-5);
}

// LMImpl::loss_sum through the fused function (numerics.fused_loss) equals the plain path, fp32:
// loss and every parameter's gradient (GPT's tied head, Llama's own head and tied).
TEST(FusedHeadLoss, ModelLossSumMatchesThePlainPath) {
  auto llama = test::tiny_model();
  llama.arch = "llama", llama.n_head = 4, llama.n_kv_head = 2, llama.ffn_multiple_of = 16;
  auto llama_tied = llama;
  llama_tied.tie_embeddings = true;
  for (const auto& c : {test::tiny_model(), llama, llama_tied}) {
    SCOPED_TRACE(c.arch + (c.tie_embeddings ? " tied" : ""));
    torch::manual_seed(5);
    LM m = build_model(c, 64);
    auto idx = torch::randint(0, 64, {3, 16}, torch::kLong), tgt = torch::randint(0, 64, {3, 16}, torch::kLong);
    tgt.slice(1, 10, 16).fill_(-1);
    auto grads = [&](bool fused) {
      m->numerics.fused_loss = fused;
      m->zero_grad();
      auto loss = m->loss_sum(idx, tgt);
      loss.backward();
      std::vector<torch::Tensor> g = {loss.detach()};
      for (auto& p : m->parameters()) g.push_back(p.grad().clone());
      return g;
    };
    auto plain = grads(false), fused = grads(true);
    EXPECT_NEAR(fused[0].item<double>(), plain[0].item<double>(), 1e-5 * plain[0].item<double>());
    for (size_t i = 1; i < plain.size(); ++i) EXPECT_LT(nt_rel_err(fused[i], plain[i]), 1e-5) << "parameter " << i;
    EXPECT_TRUE(torch::equal(m->forward(idx), F::linear(m->hidden(idx, nullptr), m->head_weight())));
  }
}

std::string nt_needs_cpu_autocast() {
  return compat::kHasCpuAutocast ? "" : "LibTorch " + compat::torch_version() + " has no CPU bf16 autocast (>= 2.4): " +
                                            "bash launch/torch2.sh runs this against LibTorch 2.6";
}

// train.bf16_residual changes the dtype of the residual stream: a block's output and the final
// norm's are bf16 under autocast with the flag, fp32 without it; the loss stays close.
TEST(Bf16Residual, ResidualStreamIsBf16UnderTheFlag) {
  if (auto why = nt_needs_cpu_autocast(); !why.empty()) GTEST_SKIP() << why;
  auto llama = test::tiny_model();
  llama.arch = "llama", llama.n_head = 4, llama.n_kv_head = 2, llama.ffn_multiple_of = 16;
  for (const auto& c : {test::tiny_model(), llama}) {
    SCOPED_TRACE(c.arch);
    torch::manual_seed(6);
    LM m = build_model(c, 64);
    auto idx = torch::randint(0, 64, {2, 16}, torch::kLong);
    const torch::Device cpu(torch::kCPU);
    auto run = [&](bool flag) {
      m->numerics.bf16_residual = flag;
      compat::set_autocast(cpu, true);
      auto h = m->hidden(idx, nullptr);
      auto loss = m->loss(idx, idx);
      compat::set_autocast(cpu, false);
      compat::clear_autocast_cache();
      return std::make_pair(h.scalar_type(), loss.item<double>());
    };
    auto [dtype_off, loss_off] = run(false);
    auto [dtype_on, loss_on] = run(true);
    EXPECT_EQ(dtype_off, torch::kFloat);
    EXPECT_EQ(dtype_on, torch::kBFloat16);
    EXPECT_NEAR(loss_on, loss_off, 2e-2 * loss_off);
    EXPECT_NE(loss_on, loss_off) << "the flag changed nothing";
    if (c.arch == "gpt") {  // a block's output
      auto* gpt = dynamic_cast<GPTImpl*>(m.get());
      ASSERT_NE(gpt, nullptr);
      compat::set_autocast(cpu, true);
      auto x = torch::randn({2, 16, c.d_model});
      auto y_fp32 = gpt->blocks[0]->as<Block>()->forward(x);
      auto y_bf16 = gpt->blocks[0]->as<Block>()->forward(x.to(torch::kBFloat16));
      compat::set_autocast(cpu, false);
      compat::clear_autocast_cache();
      EXPECT_EQ(y_fp32.scalar_type(), torch::kFloat);
      EXPECT_EQ(y_bf16.scalar_type(), torch::kBFloat16);
    }
  }
}

// The attention start-up line names the kernel and says whether merging the heads copies; what
// it says is what happens (the merged output shares the attention output's storage or not), and
// the attention equals the plain softmax(q k^T / sqrt(hd) + causal mask) v.
TEST(Attention, StartupLineSaysTheKernelAndTheCopy) {
  auto c = test::tiny_model();
  const auto line = describe_attention(c, 2, torch::kFloat, torch::Device(torch::kCPU), /*train=*/true);
  EXPECT_EQ(line.rfind("attention: ", 0), 0u) << line;
  if (compat::kHasSdpa) {
    EXPECT_NE(line.find("(at::_fused_sdp_choice = "), std::string::npos) << line;
    EXPECT_NE(line.find("B=2 H=2 T=16 hd=16"), std::string::npos) << line;
  } else {
    EXPECT_NE(line.find("the fused CPU kernel"), std::string::npos) << line;
    EXPECT_NE(describe_attention(c, 2, torch::kDouble, torch::Device(torch::kCPU), true).find("the plain kernel"),
              std::string::npos);
  }
  torch::manual_seed(7);
  const int64_t B = 2, T = 16, H = 2, hd = 16;
  auto parts = torch::randn({B, T, 3 * H * hd}).split(H * hd, 2);
  auto heads = [&](const torch::Tensor& t) { return t.view({B, T, H, hd}).transpose(1, 2); };
  auto q = heads(parts[0]), k = heads(parts[1]), v = heads(parts[2]);
  auto y = causal_attention(q, k, v, 0.0, false);
  auto merged = merge_heads(y);
  EXPECT_EQ(merged.sizes(), (std::vector<int64_t>{B, T, H * hd}));
  const bool shares = merged.data_ptr() == y.data_ptr();
  if (compat::kHasSdpa) {  // 2.x on the CPU: flash attention, whose output is (B, T, H, hd) in memory
    EXPECT_NE(line.find("flash attention"), std::string::npos) << line;
    EXPECT_NE(line.find("without a copy"), std::string::npos) << line;
    EXPECT_TRUE(shares) << "merge_heads copied a contiguous (B, T, C) output";
  }
  auto qd = q.to(torch::kDouble), kd = k.to(torch::kDouble), vd = v.to(torch::kDouble);
  auto att = torch::matmul(qd, kd.transpose(-2, -1)) / std::sqrt(static_cast<double>(hd));
  att.masked_fill_(torch::ones({T, T}, torch::kBool).triu(1), -INFINITY);
  auto ref = torch::matmul(torch::softmax(att, -1), vd).transpose(1, 2).reshape({B, T, H * hd});
  EXPECT_LT(nt_rel_err(merged, ref), 1e-5);
}

// ---- the switches in real trainer runs (configs/tiny.yaml on the bytes dataset, CPU) ----

std::vector<nlohmann::json> nt_train_records(const std::string& run) {
  std::vector<nlohmann::json> out;
  for (auto& line : test::metrics_of_kind(run + "/metrics.jsonl", "train")) out.push_back(nlohmann::json::parse(line));
  return out;
}

test::RunResult nt_trainer(const std::string& run, std::vector<std::string> extra) {
  std::vector<std::string> a = {test::source_path("configs/tiny.yaml"), "data.train=" + test::shared_bytes_dataset(),
                                "run.dir=" + run, "eval.batches=0", "train.threads=1", "checkpoint.every_steps=0"};
  a.insert(a.end(), extra.begin(), extra.end());
  return test::run_bin("trainer", a);
}

// train.fused_loss=on against off, fp32 on the CPU: the same losses within float rounding over 30
// steps; auto is off on the CPU (the start-up line says which).
TEST(FusedHeadLoss, TrainerRunOnMatchesOff) {
  test::TempDir a, b;
  auto ra = nt_trainer(a.path(), {"train.max_steps=30", "train.fused_loss=auto"});
  ASSERT_EQ(ra.exit_code, 0) << ra.out;
  auto rb = nt_trainer(b.path(), {"train.max_steps=30", "train.fused_loss=on"});
  ASSERT_EQ(rb.exit_code, 0) << rb.out;
  EXPECT_NE(ra.out.find("loss: fp32 logits + cross-entropy (train.fused_loss=auto)"), std::string::npos) << ra.out;
  EXPECT_NE(rb.out.find("loss: the fused head + cross-entropy (train.fused_loss=on)"), std::string::npos) << rb.out;
  EXPECT_NE(ra.out.find("attention: "), std::string::npos) << ra.out;
  const auto la = nt_train_records(a.path()), lb = nt_train_records(b.path());
  ASSERT_EQ(la.size(), 3u);
  ASSERT_EQ(lb.size(), 3u);
  for (size_t i = 0; i < la.size(); ++i) {
    const double x = la[i]["loss"].get<double>(), y = lb[i]["loss"].get<double>();
    EXPECT_NEAR(y, x, 1e-4 * x) << "window " << i;
  }
}

TEST(Bf16Residual, RefusedWithoutBf16) {
  test::TempDir a;
  auto r = nt_trainer(a.path(), {"train.max_steps=2", "train.bf16_residual=true"});
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("key 'train.bf16_residual': needs train.dtype=bf16"), std::string::npos) << r.out;
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << "one line: " << r.out;
}

// bf16 against bf16 + train.bf16_residual over 300 steps of the tiny GPT: the same loss curve
// (windows of 50 steps within 3%) and a loss that clearly falls.
TEST(Bf16Residual, TrainsLikeTheFp32ResidualStream) {
  if (auto why = nt_needs_cpu_autocast(); !why.empty()) GTEST_SKIP() << why;
  test::TempDir a, b;
  const std::vector<std::string> common = {"train.max_steps=300", "log.every_steps=50", "train.dtype=bf16",
                                           "model.seq_len=32", "train.micro_batch_size=8"};
  auto ra = nt_trainer(a.path(), common);
  ASSERT_EQ(ra.exit_code, 0) << ra.out;
  auto v = common;
  v.push_back("train.bf16_residual=true");
  auto rb = nt_trainer(b.path(), v);
  ASSERT_EQ(rb.exit_code, 0) << rb.out;
  EXPECT_NE(rb.out.find("residual stream bf16"), std::string::npos) << rb.out;
  const auto la = nt_train_records(a.path()), lb = nt_train_records(b.path());
  ASSERT_EQ(la.size(), 6u);
  ASSERT_EQ(lb.size(), 6u);
  bool differs = false;
  for (size_t i = 0; i < la.size(); ++i) {
    const double x = la[i]["loss"].get<double>(), y = lb[i]["loss"].get<double>();
    EXPECT_NEAR(y, x, 0.03 * x) << "window " << i;
    differs |= x != y;
  }
  EXPECT_TRUE(differs) << "the flag changed nothing";
  EXPECT_LT(lb.back()["loss"].get<double>(), lb.front()["loss"].get<double>() - 1.0) << "the loss did not fall";
}

}  // namespace
}  // namespace lm
