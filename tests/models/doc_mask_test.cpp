// data.doc_mask (models/lm.h: DocMask): a packed window's documents kept apart. The documents and
// positions of a window; the loss of a packed window against its documents' losses each computed
// on its own (GPT and Llama, fp32, one document cut by each window edge), with and without
// activation checkpointing; the fused CPU kernel and the 1.13 / SDPA path against a reference
// masked attention; generation's context of one document. The trainer runs (resume, two ranks,
// activation checkpointing, the bucketed refusal) are in tests/trainer/ (DocMask in
// resume_test.cpp, act_ckpt_test.cpp and config_test.cpp).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <array>
#include <cmath>
#include <limits>
#include <utility>
#include <vector>

#include "common/torch/compat.h"
#include "models/attention.h"
#include "models/build.h"
#include "models/cpu_kernels.h"
#include "models/lm.h"
#include "tests/testutil.h"
#include "trainer/generate/generate.h"

namespace lm {
namespace {

constexpr int64_t kV = 64, kEos = 63;  // the tests' vocabulary and EOS id

ModelConfig doc_llama() { return test::tiny_llama_model(); }

// A document's tokens (no EOS) drawn from [0, kEos).
torch::Tensor doc_tokens(int64_t n) { return torch::randint(0, kEos, {n}, torch::kLong); }
torch::Tensor eos() { return torch::full({1}, kEos, torch::kLong); }

// The host loop (CPU) and the cummax of the other devices give the same documents.
// Checked to fail with a document started at its EOS (x[i] == eos instead of x[i-1]).
TEST(DocMask, StartsAndPositionsRestartAfterEachEos) {
  const int64_t E = kEos;
  auto idx = torch::tensor({5L, E, 3L, 4L, E, E, 7L, 8L}, torch::kLong).view({1, 8});
  auto m = doc_mask_of(torch::cat({idx, torch::tensor({E, 1L, 2L, 3L, 4L, 5L, 6L, E}, torch::kLong).view({1, 8})}), E);
  EXPECT_EQ(std::vector<int64_t>(m.start[0].data_ptr<int64_t>(), m.start[0].data_ptr<int64_t>() + 8),
            (std::vector<int64_t>{0, 0, 2, 2, 2, 5, 6, 6}));
  EXPECT_EQ(std::vector<int64_t>(m.pos[0].data_ptr<int64_t>(), m.pos[0].data_ptr<int64_t>() + 8),
            (std::vector<int64_t>{0, 1, 0, 1, 2, 0, 0, 1}));
  EXPECT_EQ(std::vector<int64_t>(m.start[1].data_ptr<int64_t>(), m.start[1].data_ptr<int64_t>() + 8),
            (std::vector<int64_t>{0, 1, 1, 1, 1, 1, 1, 1}));
  // The mask: query i sees start[i] .. i.
  auto allowed = doc_attention_mask(m);
  EXPECT_EQ(allowed.sizes(), (std::vector<int64_t>{2, 1, 8, 8}));
  EXPECT_TRUE(allowed[0][0][4][2].item<bool>());
  EXPECT_FALSE(allowed[0][0][4][1].item<bool>());
  EXPECT_FALSE(allowed[0][0][4][5].item<bool>());
  // What doc_mask_of computes off the CPU (cummax), here on the CPU: the same starts.
  auto both = torch::cat({idx, torch::tensor({E, 1L, 2L, 3L, 4L, 5L, 6L, E}, torch::kLong).view({1, 8})});
  auto after_eos = torch::zeros(both.sizes(), torch::kBool);
  after_eos.slice(1, 1, 8).copy_(both.slice(1, 0, 7) == E);
  EXPECT_TRUE(torch::equal(std::get<0>(torch::cummax(torch::arange(8, torch::kLong).expand_as(both) * after_eos, 1)), m.start));
}

// Reference attention in double: plain matmul and softmax under the block-diagonal causal mask.
torch::Tensor reference_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                  const torch::Tensor& start) {
  const int64_t B = q.size(0), T = q.size(2);
  auto mask = torch::zeros({B, 1, T, T}, torch::kBool);
  auto a = mask.accessor<bool, 4>();
  auto st = start.accessor<int64_t, 2>();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < T; ++i)
      for (int64_t j = st[b][i]; j <= i; ++j) a[b][0][i][j] = true;
  auto att = torch::matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(q.size(-1)));
  att = att.masked_fill(mask.logical_not(), -std::numeric_limits<double>::infinity());
  return torch::matmul(torch::softmax(att, -1), v);
}

// The fused kernel (models/cpu_kernels.h, LibTorch 1.13's GPT path) and causal_attention (1.13's
// baddbmm with the -inf bias; SDPA with the boolean mask on 2.x) against the reference, forward and
// gradients; one block per row is the plain causal kernel, bit for bit.
// Checked to fail with the fused kernel's backward loop over a document's columns cut one short
// (j < L - 1) and with the 1.13 bias built from the causal mask alone.
TEST(DocMask, KernelsMatchReferenceMaskedAttention) {
  torch::manual_seed(5);
  const int64_t B = 2, T = 29, H = 3, hd = 8, C = H * hd;
  auto idx = torch::randint(0, kEos, {B, T}, torch::kLong);
  for (int64_t i : {6, 7, 19}) idx[0][i].fill_(kEos);  // row 0: documents [0,7) [7,8) [8,20) [20,29); row 1: one
  idx[1][T - 1].fill_(kEos);
  const DocMask docs = doc_mask_of(idx, kEos);
  auto qkv = torch::randn({B, T, 3 * C});
  auto g = torch::randn({B, T, C});
  auto ref_in = qkv.to(torch::kDouble).requires_grad_(true);
  auto parts = ref_in.split(C, 2);
  auto heads = [&](const torch::Tensor& t) { return t.view({B, T, H, hd}).transpose(1, 2); };
  auto ref = reference_attention(heads(parts[0]), heads(parts[1]), heads(parts[2]), docs.start)
                 .transpose(1, 2).contiguous().view({B, T, C});
  auto ref_grad = torch::autograd::grad({ref}, {ref_in}, {g.to(torch::kDouble)})[0];
  auto err = [](const torch::Tensor& a, const torch::Tensor& b) {
    return (a.to(torch::kDouble) - b.detach()).abs().max().item<double>();
  };
  // causal_attention on split heads (float32): the model's path wherever the fused kernel is not.
  {
    auto in = qkv.clone().requires_grad_(true);
    auto p = in.split(C, 2);
    auto y = merge_heads(causal_attention(heads(p[0]), heads(p[1]), heads(p[2]), 0.0, true, &docs));
    auto grad = torch::autograd::grad({y}, {in}, {g})[0];
    EXPECT_LT(err(y, ref), 2e-6);
    EXPECT_LT(err(grad, ref_grad), 2e-5);
  }
  if (!causal_attention_qkv_applies(qkv)) {
    ASSERT_TRUE(compat::kHasSdpa) << "LibTorch 1.13 on CPU must have found BLAS's sgemm_";
    GTEST_SKIP() << "no sgemm_ in this process (LibTorch 2.x uses SDPA instead)";
  }
  auto run = [&](const torch::Tensor& start) {
    auto v = qkv.clone().requires_grad_(true);
    auto y = causal_attention_qkv(v, H, start);
    return std::make_pair(y.detach(), torch::autograd::grad({y}, {v}, {g})[0]);
  };
  auto [y, grad] = run(docs.start);
  EXPECT_LT(err(y, ref), 2e-6);
  EXPECT_LT(err(grad, ref_grad), 2e-5);
  // The model's GPT path: on LibTorch 1.13 the fused kernel with the documents (the same bits); on
  // 2.x SDPA with the documents' boolean mask (LibTorch 2.14 picks its CPU flash kernel), whose
  // online softmax rescales its partial sums once per key block: a few more float32 roundings of
  // values of order 1, held to the bound Torch2Cpu.SdpaMatchesTheFused113AttentionKernel uses.
  const auto ym = causal_self_attention(qkv, H, 0.0, true, nullptr, 0, &docs);
  EXPECT_LT(err(ym, ref), compat::kHasSdpa ? 1e-5 : 2e-6);
  if (!compat::kHasSdpa) {
    EXPECT_TRUE(torch::equal(ym, y));
  }
  // One document per row (every start 0) is the plain kernel's calls: the same bits.
  auto [y1, grad1] = run(torch::zeros({B, T}, torch::kLong));
  auto [y0, grad0] = run(torch::Tensor());
  EXPECT_TRUE(torch::equal(y1, y0));
  EXPECT_TRUE(torch::equal(grad1, grad0));
  EXPECT_THROW(causal_attention_qkv(qkv, H, torch::zeros({B, T + 1}, torch::kLong)), c10::Error);
}

// One packed batch: row 0 is [the end of a document cut by the window's start, EOS | a whole
// document, EOS | a document cut by the window's end]; row 1 [a whole document, EOS | a cut one].
// pieces: (row, start, end) of each document in the window.
struct Packed {
  torch::Tensor x, y;
  std::vector<std::array<int64_t, 3>> pieces;
};

Packed packed_batch() {
  Packed p;
  auto row0 = torch::cat({doc_tokens(4), eos(), doc_tokens(6), eos(), doc_tokens(4)});  // 5 + 7 + 4 = 16
  auto row1 = torch::cat({doc_tokens(9), eos(), doc_tokens(6)});                        // 10 + 6 = 16
  p.x = torch::stack({row0, row1});
  p.y = torch::randint(0, kV, {2, 16}, torch::kLong);  // any targets: each is its own position's
  p.y[1][3].fill_(-1);                                 // an ignored target
  p.pieces = {{0, 0, 5}, {0, 5, 12}, {0, 12, 16}, {1, 0, 10}, {1, 10, 16}};
  return p;
}

// The packed loss and its gradients (flat, in parameter order) with doc_eos set, in training mode.
std::pair<double, torch::Tensor> packed_loss_and_grads(LM& m, const Packed& p, bool checkpoint) {
  m->train();
  m->zero_grad();
  m->numerics.doc_eos = kEos;
  m->numerics.recompute_blocks = checkpoint;
  auto loss = m->loss_sum(p.x, p.y);
  loss.backward();
  std::vector<torch::Tensor> gs;
  for (auto& t : m->parameters()) gs.push_back(t.grad().reshape({-1}).clone());
  m->numerics.recompute_blocks = false;
  return {loss.item<double>(), torch::cat(gs)};
}

// The loss of a packed window = the sum of its documents' losses, each document computed on its own
// (positions from 0, no mask: the plain model), in fp32 within 1e-6 relative, and so are the
// gradients (within float rounding); logits per position too. Activation checkpointing gives the
// same bits as without. Without the mask the window's loss is another one.
// Checked to fail with GPT's positions left as arange (the loss off by 5e-4 relative), with the
// mask dropped from Llama's attention (1.13's bias without the documents), with GPT's fused kernel
// computing one [0, T) block, and (the checkpointed comparison, both) with the checkpointed blocks
// given no documents. Llama's RoPE restarted at each document (done) is not visible here: under
// the mask RoPE's scores depend only on i - j inside a document, so absolute angles give the same
// loss within float rounding (checked: it passes with the restart removed).
TEST(DocMask, PackedWindowLossEqualsSumOfItsDocumentsAlone) {
  for (const auto& c : {test::tiny_model(), doc_llama()}) {
    SCOPED_TRACE(c.arch);
    torch::manual_seed(11);
    LM m = build_model(c, kV);
    const Packed p = packed_batch();
    const auto [packed, grads] = packed_loss_and_grads(m, p, /*checkpoint=*/false);

    m->numerics.doc_eos = -1;  // each document alone, the plain model
    m->zero_grad();
    double alone = 0;
    torch::Tensor alone_sum = torch::zeros({}, torch::kFloat);
    for (const auto& [row, s, e] : p.pieces) {
      auto xs = p.x[row].slice(0, s, e).view({1, -1}), ys = p.y[row].slice(0, s, e).view({1, -1});
      auto l = m->loss_sum(xs, ys);
      alone_sum = alone_sum + l;
      alone += l.item<double>();
    }
    alone_sum.backward();
    std::vector<torch::Tensor> gs;
    for (auto& t : m->parameters()) gs.push_back(t.grad().reshape({-1}).clone());
    const auto alone_grads = torch::cat(gs);
    EXPECT_NEAR(packed, alone, 1e-6 * std::abs(alone)) << packed << " vs " << alone;
    EXPECT_LT((grads - alone_grads).abs().max().item<double>(), 1e-5 * alone_grads.abs().max().item<double>());

    // Logits: the packed window's positions of a document are the document's own logits.
    {
      torch::NoGradGuard ng;
      m->eval();
      m->numerics.doc_eos = kEos;
      auto full = m->forward(p.x);
      m->numerics.doc_eos = -1;
      for (const auto& [row, s, e] : p.pieces) {
        auto own = m->forward(p.x[row].slice(0, s, e).view({1, -1}))[0];
        EXPECT_TRUE(torch::allclose(full[row].slice(0, s, e), own, 1e-5, 1e-5)) << row << " [" << s << "," << e << ")";
      }
      // Without the mask, the documents after the first see the ones before them.
      auto plain = m->forward(p.x);
      EXPECT_FALSE(torch::allclose(plain[0].slice(0, 5, 16), full[0].slice(0, 5, 16), 1e-3, 1e-3));
    }

    // Activation checkpointing with the mask: the same loss and gradients, bit for bit.
    const auto [ck, ck_grads] = packed_loss_and_grads(m, p, /*checkpoint=*/true);
    EXPECT_EQ(ck, packed);
    EXPECT_TRUE(torch::equal(ck_grads, grads));
  }
}

// Generation with doc_eos: the context is the last token's document, so a prompt after other
// documents continues as the prompt alone, with and without the KV cache, with and without the
// model's own mask (numerics.doc_eos, used by the uncached forward), past seq_len. Checked to fail with the context start left at n - seq_len (the earlier
// documents seen).
TEST(DocMask, GenerateSeesTheLastDocumentOnly) {
  for (const auto& c : {test::tiny_model(), doc_llama()}) {
    SCOPED_TRACE(c.arch);
    torch::manual_seed(2);
    LM m = build_model(c, kV);
    {  // sharper than the init (whose greedy tokens hardly depend on the context)
      torch::NoGradGuard ng;
      for (auto& t : m->parameters())
        if (t.dim() > 1) t.mul_(6);
    }
    SampleOptions o;
    o.temperature = 0;
    o.max_new_tokens = 40;
    o.doc_eos = kEos;
    const std::vector<int64_t> prompt = {kEos, 1, 2, 3};
    const std::vector<int64_t> after = {9, 8, 7, 6, 5, kEos, 1, 2, 3};  // another document first
    auto a = generate(m, prompt, o);
    auto b = generate(m, after, o);
    ASSERT_EQ(a.size(), 44u);
    EXPECT_EQ(std::vector<int64_t>(a.begin() + 4, a.end()), std::vector<int64_t>(b.begin() + 9, b.end()));
    o.kv_cache = false;
    EXPECT_EQ(generate(m, after, o), b);
    m->numerics.doc_eos = kEos;  // the uncached forward under the model's mask: the same
    EXPECT_EQ(generate(m, after, o), b);
    o.kv_cache = true;
    EXPECT_EQ(generate(m, after, o), b);  // the cached forward ignores the model's mask (lm.h)
    m->numerics.doc_eos = -1;
    // The earlier document would change the prediction (greedy tokens of a random model may not show it).
    torch::NoGradGuard ng;
    auto with = m->forward(torch::tensor(after, torch::kLong).view({1, -1})).select(1, 8);
    auto alone = m->forward(torch::tensor(std::vector<int64_t>{1, 2, 3}, torch::kLong).view({1, -1})).select(1, 2);
    EXPECT_FALSE(torch::allclose(with, alone, 1e-4, 1e-4));
  }
}

}  // namespace
}  // namespace lm
