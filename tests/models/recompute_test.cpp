// Activation checkpointing (models/recompute.h, numerics.recompute_blocks: the trainer's
// train.activation_checkpointing=block) against the plain forward, GPT (dropout on) and Llama, fp32
// and bf16 autocast: the losses and every parameter's gradient bit for bit, the default generator
// where the plain run leaves it, the parameters' AccumulateGrad hooks (DDP's) fired once each, and
// the checkpoint in the graph only when training with grad and no cache.
#include <gtest/gtest.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/torch.h>

#include <map>
#include <set>
#include <string>
#include <vector>

#include "common/torch/compat.h"
#include "models/build.h"
#include "models/recompute.h"
#include "models/lm.h"
#include "tests/testutil.h"

namespace lm {
namespace {

ModelConfig ac_gpt() {
  auto c = test::tiny_model();  // 2 layers, d 32, T 16
  c.n_layer = 3;
  c.dropout = 0.2;  // embeddings, attention weights and both residual branches draw
  return c;
}

ModelConfig ac_llama() {
  auto c = test::tiny_model();
  c.arch = "llama", c.n_layer = 3, c.n_head = 4, c.n_kv_head = 2, c.ffn_multiple_of = 16;  // no dropout in Llama
  return c;
}

// CPU autocast to bf16 on or off (compat: also on LibTorch 1.13, whose CPU autocast the trainer
// does not use), as the trainer's step sets it around the forward.
void ac_autocast(bool on) {
  compat::AutocastState s = compat::autocast_state();
  s.cpu = on;
  s.cpu_dtype = at::kBFloat16;
  compat::set_autocast_state(s);
}

// Nodes of t's backward graph whose name contains `part` (CheckpointBlock: one per checkpointed block).
int ac_count_nodes(const torch::Tensor& t, const std::string& part) {
  std::vector<torch::autograd::Node*> todo;
  std::set<torch::autograd::Node*> seen;
  if (t.grad_fn()) todo.push_back(t.grad_fn().get());
  int n = 0;
  while (!todo.empty()) {
    auto* node = todo.back();
    todo.pop_back();
    if (!seen.insert(node).second) continue;
    if (node->name().find(part) != std::string::npos) ++n;
    for (const auto& e : node->next_edges())
      if (e.function) todo.push_back(e.function.get());
  }
  return n;
}

torch::Tensor ac_cpu_rng_state() { return at::detail::getDefaultCPUGenerator().get_state(); }

struct AcRun {
  std::vector<torch::Tensor> losses;  // per micro-batch
  std::vector<torch::Tensor> draws;   // what the generator gave between each forward and its backward
  std::map<std::string, torch::Tensor> grads;
  torch::Tensor rng_after;  // the default generator's state after the last backward
  int checkpoints = 0;      // CheckpointBlock nodes in the first micro-batch's graph
};

// Two micro-batches from the same weights, data and generator state, as the trainer runs them:
// autocast (bf16) on for the forward only, (loss / 2).backward() accumulating into .grad, the cast
// cache cleared after each. Between a forward and its backward the generator is drawn from, so a
// rerun that started from the generator's state at the backward (or left it where the forward
// began) would show in the gradients, the draws or the final state.
AcRun ac_run(const ModelConfig& c, bool checkpoint, bool bf16, bool bf16_residual = false, bool fused_loss = false) {
  torch::manual_seed(5);
  LM m = build_model(c, 64);
  m->train();
  m->numerics.recompute_blocks = checkpoint;
  m->numerics.bf16_residual = bf16_residual;
  m->numerics.fused_loss = fused_loss;
  auto idx = torch::randint(0, 64, {2, 3, c.seq_len}, torch::kLong), targets = torch::randint(0, 64, {2, 3, c.seq_len}, torch::kLong);
  torch::manual_seed(11);  // the dropout stream
  AcRun r;
  for (int64_t mb = 0; mb < 2; ++mb) {
    if (bf16) ac_autocast(true);
    auto loss = m->loss_sum(idx[mb], targets[mb]);
    if (bf16) ac_autocast(false);
    if (mb == 0) r.checkpoints = ac_count_nodes(loss, "CheckpointBlock");
    r.draws.push_back(torch::rand({4}));
    (loss / 2).backward();
    if (bf16) compat::clear_autocast_cache();
    r.losses.push_back(loss.detach());
  }
  r.rng_after = ac_cpu_rng_state();
  for (const auto& p : m->named_parameters()) {
    EXPECT_TRUE(p.value().grad().defined()) << p.key() << " got no gradient";
    if (p.value().grad().defined()) r.grads[p.key()] = p.value().grad().clone();
  }
  return r;
}

// Everything bit for bit: torch::equal (same dtype, shape and values).
void ac_expect_identical(const AcRun& plain, const AcRun& ckpt, int64_t layers) {
  EXPECT_EQ(plain.checkpoints, 0);
  EXPECT_EQ(ckpt.checkpoints, layers) << "the blocks were not checkpointed";
  ASSERT_EQ(plain.losses.size(), ckpt.losses.size());
  for (size_t i = 0; i < plain.losses.size(); ++i) {
    EXPECT_TRUE(torch::equal(plain.losses[i], ckpt.losses[i]))
        << "micro-batch " << i << ": " << plain.losses[i].item<double>() << " vs " << ckpt.losses[i].item<double>();
    EXPECT_TRUE(torch::equal(plain.draws[i], ckpt.draws[i])) << "micro-batch " << i << ": the draws between forward and backward";
  }
  ASSERT_EQ(plain.grads.size(), ckpt.grads.size());
  for (const auto& [name, g] : plain.grads) {
    ASSERT_TRUE(ckpt.grads.count(name)) << name;
    EXPECT_TRUE(torch::equal(g, ckpt.grads.at(name)))
        << name << ": max |diff| " << (g.to(torch::kDouble) - ckpt.grads.at(name).to(torch::kDouble)).abs().max().item<double>();
  }
  EXPECT_TRUE(torch::equal(plain.rng_after, ckpt.rng_after)) << "the default generator is not where the plain run left it";
}

TEST(ActivationRecompute, GptWithDropoutFp32IsBitIdentical) {
  const auto c = ac_gpt();
  const auto plain = ac_run(c, false, false), ckpt = ac_run(c, true, false);
  ac_expect_identical(plain, ckpt, c.n_layer);
  EXPECT_FALSE(torch::equal(plain.draws[0], plain.draws[1]));  // the generator moves on
}

TEST(ActivationRecompute, LlamaFp32IsBitIdentical) {
  const auto c = ac_llama();
  ac_expect_identical(ac_run(c, false, false), ac_run(c, true, false), c.n_layer);
}

// bf16 autocast (the rerun under the forward's autocast state, its casts not cached), with the
// residual stream in fp32 and in bf16 (train.bf16_residual), and through the fused head + loss.
TEST(ActivationRecompute, Bf16AutocastIsBitIdentical) {
  for (const auto& c : {ac_gpt(), ac_llama()})
    for (bool residual : {false, true}) {
      SCOPED_TRACE(c.arch + (residual ? ", bf16 residual" : ", fp32 residual"));
      const auto plain = ac_run(c, false, true, residual, residual), ckpt = ac_run(c, true, true, residual, residual);
      ac_expect_identical(plain, ckpt, c.n_layer);
      const auto fp32 = ac_run(c, false, false);
      EXPECT_FALSE(torch::equal(plain.losses[0], fp32.losses[0])) << "autocast changed nothing";
    }
}

// The post-hooks on the parameters' AccumulateGrad nodes (trainer/parallel/grad_sync.cpp launches its
// all-reduces from them) fire once per parameter and backward, with the gradient as the node's
// input (it went through autograd's accumulation) and in .grad when they fire.
struct AcCountHook : torch::autograd::FunctionPostHook {
  AcCountHook(torch::Tensor p, int* n, int* without_grad) : p(std::move(p)), n(n), without_grad(without_grad) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list& inputs) override {
    ++*n;
    if (inputs.empty() || !inputs[0].defined() || !p.grad().defined()) ++*without_grad;
    return outputs;
  }
  torch::Tensor p;
  int *n, *without_grad;
};

TEST(ActivationRecompute, AccumulateGradHooksFireOncePerParameter) {
  for (const auto& c : {ac_gpt(), ac_llama()}) {
    SCOPED_TRACE(c.arch);
    torch::manual_seed(5);
    LM m = build_model(c, 64);
    m->train();
    m->numerics.recompute_blocks = true;
    const auto params = m->named_parameters();
    std::vector<int> fired(params.size(), 0);
    int without_grad = 0;
    std::vector<compat::AutogradNodePtr> accs;  // kept alive, as GradSync does
    for (size_t i = 0; i < params.size(); ++i) {
      accs.push_back(compat::grad_accumulator(params[i].value()));
      accs.back()->add_post_hook(std::make_unique<AcCountHook>(params[i].value(), &fired[i], &without_grad));
    }
    auto idx = torch::randint(0, 64, {2, c.seq_len}, torch::kLong);
    for (int step = 1; step <= 2; ++step) {
      auto loss = m->loss_sum(idx, idx);
      ASSERT_EQ(ac_count_nodes(loss, "CheckpointBlock"), c.n_layer);
      loss.backward();
      for (size_t i = 0; i < params.size(); ++i) EXPECT_EQ(fired[i], step) << params[i].key() << " at backward " << step;
    }
    EXPECT_EQ(without_grad, 0);
  }
}

// Checkpointed only in training mode with grad enabled and without a KV cache; the same outputs.
TEST(ActivationRecompute, OnlyWhenTrainingWithGradAndNoCache) {
  auto c = ac_gpt();
  c.dropout = 0;  // training and eval mode compute the same
  torch::manual_seed(5);
  LM m = build_model(c, 64);
  m->numerics.recompute_blocks = true;
  auto idx = torch::randint(0, 64, {2, c.seq_len}, torch::kLong);
  m->train();
  const auto trained = m->forward(idx);
  EXPECT_EQ(ac_count_nodes(trained, "CheckpointBlock"), c.n_layer);
  KVCache cache;
  const auto cached = m->forward(idx, &cache);
  EXPECT_EQ(ac_count_nodes(cached, "CheckpointBlock"), 0);
  EXPECT_GT(ac_count_nodes(cached, ""), 0) << "a graph, without checkpoints";
  m->eval();
  const auto evaluated = m->forward(idx);
  EXPECT_EQ(ac_count_nodes(evaluated, "CheckpointBlock"), 0);
  m->train();
  torch::Tensor no_grad;
  {
    torch::NoGradGuard ng;
    no_grad = m->forward(idx);
  }
  EXPECT_FALSE(no_grad.requires_grad());
  EXPECT_TRUE(torch::equal(trained, evaluated));
  EXPECT_TRUE(torch::equal(trained, no_grad));
  EXPECT_TRUE(torch::allclose(trained, cached, 1e-5, 1e-6));  // the cache's attention is another kernel
}

// The function alone: x that does not require grad gets none, the parameters still do; the
// autocast and generator states around it are left as they were.
TEST(ActivationRecompute, InputWithoutGradAndStatesLeftAsFound) {
  torch::manual_seed(3);
  auto w = torch::randn({8, 8}).requires_grad_(true);
  auto block = [w](const torch::Tensor& x) { return torch::dropout(torch::mm(x, w).tanh(), 0.5, true); };
  auto x = torch::randn({4, 8});
  torch::manual_seed(9);
  auto plain = block(x);
  plain.sum().backward();
  const auto want = w.grad().clone();
  w.mutable_grad() = torch::Tensor();
  torch::manual_seed(9);
  const auto before = compat::autocast_state();
  auto y = recompute_block(block, x, {w});
  EXPECT_TRUE(torch::equal(y, plain));
  const auto rng = ac_cpu_rng_state();
  y.sum().backward();
  EXPECT_TRUE(torch::equal(w.grad(), want));
  EXPECT_TRUE(torch::equal(ac_cpu_rng_state(), rng));
  const auto after = compat::autocast_state();
  EXPECT_EQ(after.cpu, before.cpu);
  EXPECT_EQ(after.cache, before.cache);
  EXPECT_FALSE(x.grad().defined());
}

// Autocast's cache of cast weights is neither filled by the block's first (no-grad) run nor read by
// its rerun: a weight cast without grad and cached would reach a later use, or the rerun, without a
// gradient path. mm of a leaf weight casts through the cache on the CPU too (the models' Linear
// layers cast a transposed view there, which is never cached; CUDA's autocast casts the weight).
TEST(ActivationRecompute, AutocastCastCacheNeitherFilledNorRead) {
  torch::manual_seed(3);
  auto w = torch::randn({8, 8}).requires_grad_(true);
  auto block = [w](const torch::Tensor& x) { return torch::mm(x, w).tanh(); };
  const auto x = torch::randn({4, 8}).requires_grad_(true);
  auto run = [&](bool checkpoint) {
    w.mutable_grad() = torch::Tensor();
    ac_autocast(true);
    auto y = checkpoint ? recompute_block(block, x, {w}) : block(x);
    const bool later_use_has_grad = torch::mm(x.detach(), w).requires_grad();  // in the same autocast region
    ac_autocast(false);
    y.to(torch::kFloat).sum().backward();
    compat::clear_autocast_cache();
    EXPECT_TRUE(later_use_has_grad) << "the first run cached a cast of w without grad";
    return std::make_pair(y.detach(), w.grad().defined() ? w.grad().clone() : torch::Tensor());
  };
  const auto [y0, g0] = run(false);
  const auto [y1, g1] = run(true);
  EXPECT_EQ(y0.scalar_type(), torch::kBFloat16) << "mm ran in bf16";
  ASSERT_TRUE(g1.defined()) << "w got no gradient: the rerun read a cast cached without grad";
  EXPECT_TRUE(torch::equal(y0, y1));
  EXPECT_TRUE(torch::equal(g0, g1));
}

}  // namespace
}  // namespace lm
