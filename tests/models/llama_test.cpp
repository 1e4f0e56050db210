// The llama architecture and the registry: closed formulas against the modules and published
// shapes, config keys per architecture, grouped-query attention, KV-cache generation, the
// independent Python peer (bench/llama_peer.py), and Hugging Face export/import.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <regex>

#include "models/build.h"
#include "models/hf.h"
#include "models/llama.h"
#include "tests/testutil.h"
#include "trainer/hf/hf_dir.h"
#include "trainer/checkpoint/safetensors.h"
#include "run/config/config.h"
#include "trainer/generate/generate.h"

namespace lm {
namespace {

using test::run_bin;
using test::TempDir;

ModelConfig tiny_llama() { return test::tiny_llama_model(); }

std::string config_error(const std::vector<std::string>& overrides) {
  try {
    load_config("", overrides);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(Registry, ParamCountFormulaMatchesTheModules) {
  std::vector<ModelConfig> cs = {test::tiny_model(), tiny_llama()};
  auto c = tiny_llama();
  c.tie_embeddings = true;
  c.n_kv_head = 1;
  cs.push_back(c);
  c = tiny_llama();
  c.n_kv_head = 0;  // plain multi-head
  c.ffn_dim_multiplier = 1.3;
  c.ffn_multiple_of = 24;
  cs.push_back(c);
  for (const auto& m : cs) {
    auto model = build_model(m, 64);
    EXPECT_EQ(model->num_params(), param_count(m, 64)) << m.arch;
    // Matmul weights read off the module: every 2-D weight but the lookups (gpt's position table,
    // an untied input table); a tied table is the head, a matmul.
    double counted = 0;
    for (const auto& p : model->named_parameters()) {
      const bool lookup = p.key() == "wpe.weight" || (p.key() == "tok_embeddings.weight" && !m.tie_embeddings);
      if (p.value().dim() == 2 && !lookup) counted += static_cast<double>(p.value().numel());
    }
    const double attn = 12.0 * m.n_layer * m.d_model * 48;
    EXPECT_DOUBLE_EQ(flops_per_token(m, 64, 48), 6 * counted + attn) << m.arch;
  }
}

TEST(Registry, PublishedLlamaShapesComputedWithoutAllocating) {
  ModelConfig c;  // Llama 3 8B: 8.03B
  c.arch = "llama";
  c.n_layer = 32;
  c.n_head = 32;
  c.n_kv_head = 8;
  c.d_model = 4096;
  c.seq_len = 8192;
  c.ffn_multiple_of = 1024;
  c.ffn_dim_multiplier = 1.3;
  c.vocab_size = 128256;
  EXPECT_EQ(ffn_hidden(c), 14336);
  EXPECT_EQ(padded_vocab(c, 0), 128256);
  EXPECT_EQ(param_count(c, 128256), 8030261248);
  c.n_kv_head = 0;  // Llama 2 7B: 6.74B
  c.ffn_multiple_of = 256;
  c.ffn_dim_multiplier = 0;
  EXPECT_EQ(ffn_hidden(c), 11008);
  EXPECT_EQ(param_count(c, 32000), 6738415616);
}

TEST(Registry, KeysOfAnotherArchitectureAreRefused) {
  EXPECT_EQ(config_error({"model.n_kv_head=2"}),
            "override 'model.n_kv_head=2': key 'model.n_kv_head' does not apply to model.arch=gpt (only its default, 0, is accepted)");
  EXPECT_EQ(config_error({"model.arch=llama", "model.dropout=0.1"}),
            "override 'model.dropout=0.1': key 'model.dropout' does not apply to model.arch=llama (only its default, 0, is accepted)");
  EXPECT_EQ(config_error({"model.arch=llama", "model.dropout=0"}), "");  // the default: one base file serves both
  EXPECT_EQ(config_error({"model.arch=llama", "model.n_kv_head=3"}),
            "key 'model.n_kv_head': 3 does not divide model.n_head=4");
  EXPECT_EQ(config_error({"model.arch=mamba"}), "override 'model.arch=mamba': key 'model.arch': must be one of gpt|llama, got 'mamba'");
  // The resolved config shows only the architecture's keys and reads back as the same config.
  auto c = load_config(test::source_path("configs/llama-tiny.yaml"), {});
  const auto yaml = to_yaml(c);
  EXPECT_EQ(yaml.find("dropout"), std::string::npos);
  EXPECT_NE(yaml.find("n_kv_head: 2"), std::string::npos);
  TempDir dir;
  test::write_text(dir / "c.yaml", yaml);
  EXPECT_EQ(to_yaml(load_config(dir / "c.yaml", {})), yaml);
  EXPECT_EQ(to_yaml(load_config("", {})).find("n_kv_head"), std::string::npos);
}

TEST(Registry, KjvConfigsHaveAboutTheSameParameterCount) {
  auto gpt = load_config(test::source_path("configs/kjv.yaml"), {}).model;
  auto llama = load_config(test::source_path("configs/llama-kjv.yaml"), {}).model;
  const double g = param_count(gpt, 4096), l = param_count(llama, 4096);
  EXPECT_LT(std::fabs(l / g - 1), 0.02) << g << " vs " << l;
}

TEST(Llama, ShapesCausalityAndInit) {
  torch::manual_seed(0);
  auto c = tiny_llama();
  Llama m(c, 64);
  for (auto& p : m->named_parameters()) EXPECT_EQ(p.key().find("bias"), std::string::npos) << p.key();
  m->eval();
  auto a = torch::randint(0, 64, {2, 16}, torch::kLong);
  auto b = a.clone();
  b.index_put_({0, 15}, (a.index({0, 15}) + 1) % 64);
  auto la = m->forward(a), lb = m->forward(b);
  EXPECT_EQ(la.sizes(), (std::vector<int64_t>{2, 16, 64}));
  EXPECT_TRUE(torch::allclose(la.slice(1, 0, 15), lb.slice(1, 0, 15)));
  EXPECT_FALSE(torch::allclose(la.slice(1, 15, 16), lb.slice(1, 15, 16)));
  EXPECT_THROW(m->forward(torch::zeros({1, 17}, torch::kLong)), c10::Error);
  // torchtitan's init: unit embeddings, output d^-1/2 cut at 3 std, depth-scaled wo. Statistics of
  // one seeded draw (another CPU's vectorized sampler changes last bits, not the draw): the
  // sample std of n values has a spread of std / sqrt(2 n); each bound is ~4 of those or more, and
  // far below what a wrong init moves it by (a missing depth scale: x2; d^-1/2 vs 1: x5.7).
  EXPECT_NEAR(m->tok_embeddings->weight.std().item<double>(), 1.0, 0.05);  // n 2048: spread 0.016
  const double out_std = 1 / std::sqrt(32.0);
  EXPECT_LE(m->output->weight.abs().max().item<double>(), 3 * out_std + 1e-6);  // 0.53 and a few ulps (6e-8)
  EXPECT_NEAR(m->output->weight.std().item<double>(), out_std * 0.986, 0.01);  // truncation shrinks it; spread 0.0027
  auto wo1 = m->layers[1]->as<LlamaBlock>()->attention->wo->weight;
  EXPECT_NEAR(wo1.std().item<double>(), 0.02 / 2, 0.001);  // n 1024: spread 2.2e-4
}

TEST(Llama, GroupedQueryAttentionEqualsMultiHeadWithSharedKeys) {
  torch::manual_seed(0);
  auto g = tiny_llama();  // 4 heads, 2 kv heads: query heads 0,1 use kv head 0, heads 2,3 kv head 1
  auto mh = g;
  mh.n_kv_head = 4;
  Llama a(g, 64), b(mh, 64);
  auto src = module_tensors(*a);
  NamedTensors dst;
  for (auto& [name, t] : src) {
    const bool kv = name.find(".wk.") != std::string::npos || name.find(".wv.") != std::string::npos;
    dst.emplace_back(name, kv ? t.view({2, 8, 32}).repeat_interleave(2, 0).reshape({32, 32}) : t);
  }
  load_into_module(*b, dst, "mha");
  auto idx = torch::randint(0, 64, {2, 16}, torch::kLong);
  EXPECT_TRUE(torch::allclose(a->forward(idx), b->forward(idx), 1e-5, 1e-5));
}

TEST(Generate, KvCacheGivesTheSameTokensAsFullRecompute) {
  for (auto c : {test::tiny_model(), tiny_llama()}) {
    torch::manual_seed(0);
    LM m = build_model(c, 64);
    m->eval();
    // Cached logits of positions fed in pieces equal the full forward's.
    torch::NoGradGuard ng;
    auto idx = torch::randint(0, 64, {1, 16}, torch::kLong);
    KVCache cache;
    auto first = m->forward(idx.slice(1, 0, 10), &cache);
    auto next = m->forward(idx.slice(1, 10, 11), &cache);
    auto rest = m->forward(idx.slice(1, 11, 16), &cache);
    auto full = m->forward(idx);
    EXPECT_EQ(cache.pos, 16);
    EXPECT_TRUE(torch::allclose(torch::cat({first, next, rest}, 1), full, 1e-5, 1e-5)) << c.arch;
    // Greedy sampling past seq_len (the context slides): the same tokens with and without the cache.
    SampleOptions o;
    o.temperature = 0;
    o.max_new_tokens = 40;
    auto cached = generate(m, {1, 2, 3}, o);
    o.kv_cache = false;
    auto uncached = generate(m, {1, 2, 3}, o);
    EXPECT_EQ(cached, uncached) << c.arch;
    EXPECT_EQ(cached.size(), 43u);
  }
}

// Writes DIR/{config.json, weights.safetensors, hf/..., expected.safetensors} for the peer.
void write_peer_case(const std::string& dir, const ModelConfig& c, int64_t V) {
  torch::manual_seed(3);
  LM m = build_model(c, V);
  auto idx = torch::randint(0, V, {2, c.seq_len}, torch::kLong);
  auto targets = torch::randint(0, V, {2, c.seq_len}, torch::kLong);
  targets.index_put_({0, 3}, -1);
  auto logits = m->forward(idx);
  auto loss = torch::nn::functional::cross_entropy(logits.view({-1, V}), targets.view({-1}),
                                                   torch::nn::functional::CrossEntropyFuncOptions().ignore_index(-1));
  loss.backward();
  double sq = 0;
  for (auto& p : m->parameters()) sq += p.grad().to(torch::kDouble).pow(2).sum().item<double>();
  const auto tensors = module_tensors(*m);
  save_safetensors(dir + "/weights.safetensors", tensors);
  save_safetensors(dir + "/hf.safetensors", to_hf(c, tensors));
  save_safetensors(dir + "/expected.safetensors", {{"idx", idx}, {"targets", targets}, {"logits", logits.detach()},
                                                    {"loss", loss.detach()}, {"grad_norm", torch::tensor(std::sqrt(sq))}});
  test::write_text(dir + "/config.json", hf_config(c, V, 0, 0).dump());
}

TEST(Peer, IndependentPythonLlamaAgreesOnLogitsLossAndGradNorm) {
  if (run_bin("/usr/bin/python3", {"-c", "import importlib.util as u, sys; sys.exit(u.find_spec('torch') is None)"}).exit_code != 0)
    GTEST_SKIP() << "no torch for /usr/bin/python3";
  auto c = tiny_llama();
  c.seq_len = 24;
  c.rope_theta = 500000;
  c.init_std = 0.2;  // attention far from uniform, so that positions (RoPE) move the logits
  auto tied = c;
  tied.tie_embeddings = true;
  tied.n_kv_head = 1;
  TempDir dir;  // one peer process for all cases (its `import torch` is the slow part)
  std::vector<std::string> args = {test::source_path("bench/llama_peer.py"), "--check"};
  int i = 0;
  for (const auto& m : {c, tied, test::tiny_model()}) {
    args.push_back(dir / ("case" + std::to_string(i++)));
    ASSERT_EQ(::mkdir(args.back().c_str(), 0755), 0);
    write_peer_case(args.back(), m, 96);
  }
  auto r = run_bin("/usr/bin/python3", args);
  EXPECT_EQ(r.exit_code, 0) << r.out;
  // Two llama cases with our names and their HF export, the gpt case's HF export.
  int ok = 0;
  for (size_t p = r.out.find("\"ok\": true"); p != std::string::npos; p = r.out.find("\"ok\": true", p + 1)) ++ok;
  EXPECT_EQ(ok, 5) << r.out;
  std::cout << r.out;  // the differences, for the log
}

TEST(Hf, NamesAndLayoutsRoundTripExactly) {
  for (auto c : {test::tiny_model(), tiny_llama()}) {
    torch::manual_seed(0);
    LM m = build_model(c, 64);
    auto ours = module_tensors(*m);
    auto hf = to_hf(c, ours);
    std::map<std::string, torch::Tensor> by_name(hf.begin(), hf.end());
    if (c.arch == "gpt") {
      EXPECT_EQ(by_name.at("transformer.h.0.attn.c_attn.weight").sizes(), (std::vector<int64_t>{32, 96}));  // Conv1D
      EXPECT_EQ(by_name.count("lm_head.weight"), 0u);
    } else {
      EXPECT_EQ(by_name.at("model.layers.1.self_attn.k_proj.weight").sizes(), (std::vector<int64_t>{16, 32}));
      EXPECT_EQ(by_name.count("lm_head.weight"), 1u);
      EXPECT_FALSE(torch::equal(by_name.at("model.layers.0.self_attn.q_proj.weight"), ours[0].second));
    }
    auto back = from_hf(c, hf);
    ASSERT_EQ(back.size(), ours.size());
    std::map<std::string, torch::Tensor> back_by(back.begin(), back.end());
    for (auto& [n, t] : ours) EXPECT_TRUE(torch::equal(back_by.at(n), t)) << n;
  }
}

// A finished run of `config` for 2 steps in DIR.
void train_run(const std::string& config, const std::string& dir, std::vector<std::string> extra = {}) {
  std::vector<std::string> args = {test::source_path(config), "data.train=" + test::shared_bytes_dataset(),
                                   "run.dir=" + dir, "train.max_steps=2", "eval.batches=0", "train.threads=1",
                                   "model.seq_len=32", "train.micro_batch_size=2"};
  args.insert(args.end(), extra.begin(), extra.end());
  auto r = run_bin("trainer", args);
  ASSERT_EQ(r.exit_code, 0) << r.out;
}

TEST(Hf, ExportThenInitFromGivesIdenticalLogits) {
  for (std::string config : {"configs/llama-tiny.yaml", "configs/tiny.yaml"}) {
    TempDir run, out;
    train_run(config, run.path());
    auto e = run_bin("export", {"--run", run.path(), "--format", "hf", out / "hf"});
    ASSERT_EQ(e.exit_code, 0) << e.out;
    // Streamed tensor by tensor: the file save_safetensors writes of all of them converted at once,
    // byte for byte, with no more than the largest tensor and its conversion held at once.
    const auto ours = load_safetensors(run / "model.safetensors");
    save_safetensors(out / "whole.safetensors", to_hf(load_config(run / "config.yaml", {}).model, ours), {{"format", "pt"}});
    EXPECT_TRUE(test::read_text(out / "whole.safetensors") == test::read_text(out / "hf/model.safetensors")) << config;
    int64_t largest = 0, total = 0;
    for (auto& [n, t] : ours) largest = std::max<int64_t>(largest, t.nbytes()), total += t.nbytes();
    std::smatch m;
    ASSERT_TRUE(std::regex_search(e.out, m, std::regex("(\\d+) tensors streamed, at most (\\d+) bytes of them held at once"))) << e.out;
    EXPECT_EQ(std::stoll(m[1].str()), static_cast<long long>(ours.size()));
    EXPECT_LE(std::stoll(m[2].str()), 2 * largest);
    EXPECT_LT(std::stoll(m[2].str()), total / 2);
    auto j = nlohmann::json::parse(test::read_text(out / "hf/config.json"));
    auto cfg = load_config(run / "config.yaml", {});
    EXPECT_EQ(j["model_type"], cfg.model.arch == "gpt" ? "gpt2" : "llama");
    LM a = build_model(cfg.model, j["vocab_size"].get<int64_t>());
    load_into_module(*a, load_safetensors(run / "model.safetensors"), "run");
    LM b = build_model(cfg.model, j["vocab_size"].get<int64_t>());
    init_from_hf(*b, out / "hf");
    auto idx = torch::randint(0, 200, {2, 32}, torch::kLong);
    a->eval(), b->eval();
    EXPECT_TRUE(torch::equal(a->forward(idx), b->forward(idx))) << config;
    // A run starts from the export (continued pretraining): its weights are the exported ones (one
    // step at lr 1e-30 leaves every weight as it was loaded through the deferred build's writer:
    // an update below half an ulp of each).
    TempDir run2;
    train_run(config, run2.path(), {"model.init_from=" + (out / "hf"), "train.max_steps=1", "optim.lr=1e-30"});
    EXPECT_NE(test::read_text(run2 / "logs/rank_0.log").find("model.init_from: loaded"), std::string::npos);
    const auto started = load_safetensors(run2 / "model.safetensors");
    ASSERT_EQ(started.size(), ours.size());
    for (size_t i = 0; i < ours.size(); ++i) {
      EXPECT_EQ(started[i].first, ours[i].first);
      EXPECT_TRUE(torch::equal(started[i].second, ours[i].second)) << ours[i].first << ", " << config;
    }
  }
}

// An HF directory as export writes it (hf_config, to_hf) from a module of `c`.
LM write_hf_dir(const std::string& dir, const ModelConfig& c, int64_t V) {
  torch::manual_seed(5);
  LM m = build_model(c, V);
  ::mkdir(dir.c_str(), 0755);
  save_safetensors(dir + "/model.safetensors", to_hf(c, module_tensors(*m)));
  test::write_text(dir + "/config.json", hf_config(c, V, 0, 0).dump(2));
  return m;
}

// Every config.json field that changes the math, changed one at a time (or removed where
// transformers' default differs from ours), is refused naming the field, the file's value and the
// config's; the shapes alone would let most of them through (heads, eps, RoPE, activation...).
// The unchanged directory, and one whose changes compute the same, load with identical logits.
TEST(Hf, InitFromRefusesEveryFieldThatChangesTheMath) {
  auto llama = tiny_llama();
  auto untied = llama;  // d 32, 4 heads, 2 kv heads, untied, ffn 96
  auto tied = llama;
  tied.tie_embeddings = true, tied.n_kv_head = 0, tied.norm_eps = 1e-6, tied.rope_theta = 500000;
  const std::vector<std::pair<std::string, nlohmann::json>> llama_changes = {
      {"vocab_size", 128},          {"hidden_size", 64},          {"intermediate_size", 128},
      {"num_hidden_layers", 3},     {"num_attention_heads", 8},   {"num_key_value_heads", 4},
      {"head_dim", 16},             {"rms_norm_eps", 1e-3},       {"rope_theta", 500001.0},
      {"hidden_act", "gelu"},       {"attention_bias", true},     {"mlp_bias", true},
      {"rope_scaling", {{"rope_type", "llama3"}, {"factor", 8.0}}}};
  const std::vector<std::pair<std::string, nlohmann::json>> gpt_changes = {
      {"vocab_size", 128},          {"n_embd", 64},               {"n_layer", 3},
      {"n_head", 4},                {"n_positions", 32},          {"n_inner", 64},
      {"activation_function", "relu"}, {"layer_norm_epsilon", 1e-6}, {"tie_word_embeddings", false},
      {"scale_attn_weights", false}, {"scale_attn_by_inverse_layer_idx", true}};
  struct Case {
    ModelConfig c;
    std::vector<std::pair<std::string, nlohmann::json>> changes;
    std::vector<std::string> removed_refused, removed_ok;  // fields deleted from the file
  };
  auto llama_all = llama_changes;
  llama_all.push_back({"tie_word_embeddings", true});
  auto tied_all = llama_changes;
  tied_all.push_back({"tie_word_embeddings", false});
  tied_all[5].second = 2;  // num_key_value_heads: 4 is the model's own here
  const std::vector<Case> cases = {
      {untied, llama_all, {"rms_norm_eps", "num_key_value_heads", "intermediate_size"}, {"head_dim", "rope_theta", "mlp_bias"}},
      {tied, tied_all, {"rope_theta", "tie_word_embeddings"}, {"num_key_value_heads", "head_dim", "rms_norm_eps"}},
      {test::tiny_model(), gpt_changes, {"n_head", "n_positions"}, {"n_inner", "layer_norm_epsilon", "activation_function"}}};
  const int64_t V = 96;
  for (const auto& k : cases) {
    TempDir tmp;
    const std::string dir = tmp / "hf";
    LM a = write_hf_dir(dir, k.c, V);
    const auto good = nlohmann::json::parse(test::read_text(dir + "/config.json"));
    auto idx = torch::randint(0, V, {2, k.c.seq_len}, torch::kLong);
    auto loads = [&](const nlohmann::json& j) {
      test::write_text(dir + "/config.json", j.dump(2));
      LM b = build_model(k.c, V);
      init_from_hf(*b, dir);
      a->eval(), b->eval();
      EXPECT_TRUE(torch::equal(a->forward(idx), b->forward(idx))) << k.c.arch << " " << j.dump();
    };
    auto refused = [&](const nlohmann::json& j, const std::string& field, const std::string& want) {
      test::write_text(dir + "/config.json", j.dump(2));
      LM b = build_model(k.c, V);
      try {
        init_from_hf(*b, dir);
        ADD_FAILURE() << k.c.arch << ": " << field << " changed to " << j.value(field, nlohmann::json()).dump() << " was loaded";
      } catch (const CheckpointError& e) {
        const std::string msg = e.what();
        EXPECT_NE(msg.find(dir + "/config.json (model.init_from): " + field + " is "), std::string::npos) << msg;
        EXPECT_NE(msg.find(want), std::string::npos) << msg;
        EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
      }
    };
    loads(good);
    for (const auto& [field, value] : k.changes) {
      ASSERT_TRUE(good.contains(field)) << field;
      auto j = good;
      j[field] = value;
      refused(j, field, field + " is " + value.dump() + ", the config gives " + good[field].dump());
    }
    for (const auto& field : k.removed_refused) {
      auto j = good;
      j.erase(field);
      refused(j, field, field + " is absent (transformers reads ");
    }
    auto same = good;  // removed where transformers' default is ours; spelled otherwise, the same math
    for (const auto& field : k.removed_ok) same.erase(field);
    if (k.c.arch == "gpt") same["n_inner"] = 4 * k.c.d_model, same["activation_function"] = "gelu_pytorch_tanh";
    loads(same);
  }
}

TEST(Hf, InitFromRefusesAnotherShapeOrArchitecture) {
  TempDir run, out;
  train_run("configs/llama-tiny.yaml", run.path());
  ASSERT_EQ(run_bin("export", {"--run", run.path(), "--format", "hf", out / "hf"}).exit_code, 0);
  const std::vector<std::string> base = {test::source_path("configs/llama-tiny.yaml"), "data.train=" + test::shared_bytes_dataset(),
                                         "run.dir=" + (out / "r"), "model.seq_len=32", "model.init_from=" + (out / "hf")};
  auto args = base;
  args.push_back("model.n_kv_head=4");
  auto r = run_bin("trainer", args);
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("num_key_value_heads is 2, the config gives 4 (model.n_kv_head)"), std::string::npos) << r.out;
  // Half the heads at the same width: every tensor has the shape it had, the logits would not.
  args = base;
  args.insert(args.end(), {"model.n_head=2", "model.n_kv_head=1"});
  r = run_bin("trainer", args);
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("config.json (model.init_from): num_attention_heads is 4, the config gives 2 (model.n_head)\n"),
            std::string::npos) << r.out;
  args = base;
  args[0] = test::source_path("configs/tiny.yaml");
  r = run_bin("trainer", args);
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("model_type 'llama', model.arch=gpt needs 'gpt2'"), std::string::npos) << r.out;
  r = run_bin("export", {"--run", out / "nothing", "--format", "hf", out / "x"});
  EXPECT_EQ(r.exit_code, 2) << r.out;
}

TEST(Resume, CheckpointOfAnotherArchitectureIsRefused) {
  TempDir run;
  train_run("configs/llama-tiny.yaml", run.path());
  auto r = run_bin("trainer", {test::source_path("configs/tiny.yaml"), "data.train=" + test::shared_bytes_dataset(),
                               "run.dir=" + run.path(), "train.max_steps=4", "model.seq_len=32"});
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("has model architecture {\"arch\":\"llama\""), std::string::npos) << r.out;
  auto g = run_bin("generate", {"--run", run.path(), "--tokens", "8", "--temperature", "0"});
  EXPECT_EQ(g.exit_code, 0) << g.out;  // generation reads the architecture from the run
}

}  // namespace
}  // namespace lm
