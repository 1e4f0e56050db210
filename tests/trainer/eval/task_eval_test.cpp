// Downstream tasks in the loop (eval.tasks, trainer/eval/task_eval.h): batched choice scores equal
// one-example-at-a-time forwards; acc and acc_norm on a task whose answers are known; bad task files
// refused with one line naming FILE:LINE before training starts; a real run's records, summary and
// TensorBoard tags; 2 ranks over Gloo score as 1.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "models/build.h"
#include "tests/testutil.h"
#include "trainer/eval/task_eval.h"

namespace lm {
namespace {

using test::TempDir;

// The bytes tokenizer (ids 0..255 bytes, EOS 256, PAD 257) without the plugin.
class TaskBytesTok : public data::Tokenizer {
 public:
  TaskBytesTok() { info_.kind = "bytes", info_.vocab_size = 258, info_.eos_id = 256, info_.pad_id = 257; }
  std::vector<uint32_t> encode(const std::string& text) const override {
    std::vector<uint32_t> out;
    for (unsigned char c : text) out.push_back(c);
    return out;
  }
  std::string decode(const std::vector<uint32_t>&) const override { return ""; }
  const data::TokenizerInfo& info() const override { return info_; }

 private:
  data::TokenizerInfo info_;
};

LM task_model() {
  torch::manual_seed(7);
  LM m = build_model(test::tiny_model(), 264);  // T 16
  m->eval();
  return m;
}

// The reference: one row alone through forward(), its full logits, log_softmax, the scored targets.
double one_row_logprob(LM& m, const ChoiceRow& r) {
  torch::NoGradGuard ng;
  const int64_t n = static_cast<int64_t>(r.tokens.size());
  auto t = torch::tensor(r.tokens, torch::kLong);
  auto lp = torch::log_softmax(m->forward(t.slice(0, 0, n - 1).unsqueeze(0)).squeeze(0).to(torch::kDouble), -1);
  double s = 0;
  for (int64_t j = n - 1 - r.scored; j < n - 1; ++j) s += lp[j][r.tokens[static_cast<size_t>(j + 1)]].item<double>();
  return s;
}

// Checked to fail with the padding's targets shifted by one in score_choice_rows, and with the
// left cut keeping seq_len tokens instead of seq_len + 1.
TEST(TaskEval, BatchedScoresEqualOneExampleForwards) {
  LM m = task_model();
  TaskBytesTok tok;
  const std::vector<std::pair<std::string, std::string>> pairs = {
      {"In the", " beginning"}, {"And God", " said"}, {"", "Let there be"}, {"a", "b"},
      {"the first verse of a long chapter", " ends"},  // cut from the left: 1 + 33 + 5 > 17
      {"x", " a choice longer than the model's whole context"},  // the choice itself cut
      {"And", " the earth"}};
  std::vector<ChoiceRow> rows;
  int cuts = 0;
  for (const auto& [c, ch] : pairs) {
    bool cut = false;
    rows.push_back(make_choice_row(tok, c, ch, 16, &cut));
    cuts += cut;
    EXPECT_LE(rows.back().tokens.size(), 17u);
    EXPECT_EQ(rows.back().scored, std::min<int64_t>(static_cast<int64_t>(ch.size()), rows.back().tokens.size() - 1));
    if (!cut) {
      EXPECT_EQ(rows.back().tokens.front(), 256u) << "EOS first";
    }
  }
  EXPECT_EQ(cuts, 2);
  EXPECT_EQ(rows[4].tokens.back(), static_cast<int64_t>('s'));  // the right end is kept
  EXPECT_EQ(rows[5].scored, 16);
  for (int64_t batch : {1, 3, 8}) {
    const auto got = score_choice_rows(m, rows, batch, 257, torch::kCPU, false);
    ASSERT_EQ(got.size(), rows.size());
    for (size_t i = 0; i < rows.size(); ++i) {
      const double want = one_row_logprob(m, rows[i]);
      EXPECT_NEAR(got[i], want, 1e-5 * std::abs(want)) << "row " << i << ", batch " << batch;
      EXPECT_LT(got[i], 0);
    }
  }
}

void task_write(const std::string& path, const std::vector<std::string>& lines) {
  std::string s;
  for (const auto& l : lines) s += l + "\n";
  test::write_text(path, s);
}

// A model with every weight 0 gives every token log(1/V): a choice's log-likelihood is -n log V,
// so acc picks the fewest tokens (bytes) and acc_norm sees a tie (the same per byte), which goes to
// the first choice. Labels chosen so that acc = 3/4 and acc_norm = 2/4. Checked to fail with acc_norm
// dividing by the byte length plus one.
TEST(TaskEval, KnownAnswersGiveKnownAccuracy) {
  LM m = task_model();
  {
    torch::NoGradGuard ng;
    for (auto& p : m->parameters()) p.zero_();
  }
  TaskBytesTok tok;
  TempDir d;
  task_write(d / "t.jsonl", {
      R"({"context": "a", "choices": ["xx", "y", "zzz"], "label": 1})",      // acc yes, norm no
      R"({"context": "b", "choices": ["q", "rr"], "label": 0, "id": 7})",    // acc yes, norm yes
      "",                                                                   // blank: skipped
      R"({"context": "c", "choices": ["ss", "tttt", "u"], "label": 0})",    // acc no,  norm yes
      R"({"context": "a much longer context than sixteen", "choices": ["ww", "v"], "label": 1})"});  // yes, no; cut
  EvalConfig cfg;
  cfg.tasks = {{"known", d / "t.jsonl", "multiple_choice"}};
  TaskRuntime rt;
  rt.seq_len = 16, rt.batch_rows = 3;
  auto e = TaskEvaluator::create(cfg, tok, rt);
  ASSERT_TRUE(e);
  const auto s = e->score(m, nullptr);
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].name, "known");
  EXPECT_EQ(s[0].examples, 4);
  EXPECT_EQ(s[0].truncated, 1);
  EXPECT_DOUBLE_EQ(s[0].acc, 0.75);
  EXPECT_DOUBLE_EQ(s[0].acc_norm, 0.5);
  EXPECT_TRUE(m->is_training()) << "train mode after the pass";
  cfg.tasks.clear();
  EXPECT_FALSE(TaskEvaluator::create(cfg, tok, rt));
}

// Each bad file is one DataError line naming FILE:LINE (or FILE) and why. Checked to fail with the
// lines counted from 0.
TEST(TaskEval, BadFilesNameTheFileAndLine) {
  TempDir d;
  const std::string ok = R"({"context": "a", "choices": ["b", "c"], "label": 1})";
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"{\"context\": \"a\", \"choices\": [\"b\"", ":2: not valid JSON"},
      {"[1, 2]", ":2: expected a JSON object"},
      {R"({"choices": ["b"], "label": 0})", ":2: no \"context\""},
      {R"({"context": 3, "choices": ["b"], "label": 0})", ":2: \"context\" is not a string"},
      {R"({"context": "a", "label": 0})", ":2: no \"choices\""},
      {R"({"context": "a", "choices": [], "label": 0})", ":2: \"choices\" is empty"},
      {R"({"context": "a", "choices": ["b", ""], "label": 0})", ":2: choice 1 is empty"},
      {R"({"context": "a", "choices": ["b", 1], "label": 0})", ":2: choice 1 is not a string"},
      {R"({"context": "a", "choices": ["b", "c"]})", ":2: no \"label\""},
      {R"({"context": "a", "choices": ["b", "c"], "label": 2})", ":2: \"label\" 2 is out of range: 2 choices"},
      {R"({"context": "a", "choices": ["b", "c"], "label": -1})", ":2: \"label\" -1 is out of range"},
      {R"({"context": "a", "choices": ["b", "c"], "label": "0"})", ":2: \"label\" is not an integer"},
  };
  for (const auto& [line, needle] : bad) {
    task_write(d / "bad.jsonl", {ok, line, ok});
    const std::string msg = test::data_error([&] { read_mc_file(d / "bad.jsonl"); });
    EXPECT_EQ(msg.rfind(d / "bad.jsonl" + needle, 0), 0u) << line << " -> " << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  }
  task_write(d / "empty.jsonl", {"", "  "});
  EXPECT_EQ(test::data_error([&] { read_mc_file(d / "empty.jsonl"); }), d / "empty.jsonl" + ": no example in the task file (eval.tasks)");
  EXPECT_NE(test::data_error([&] { read_mc_file(d / "missing.jsonl"); }).find("missing.jsonl: cannot open"), std::string::npos);
}

// A small cloze task from the synthetic corpus: the first half of a line (20-60 bytes), its second half among
// three second halves of other lines (label rotating).
std::string task_cloze(const std::string& path, int examples) {
  std::vector<std::string> lines;
  std::istringstream in(test::synthetic_corpus(200, 5));
  for (std::string l; std::getline(in, l);)
    if (l.size() > 20 && l.size() <= 60) lines.push_back(l);  // never cut at tiny.yaml's seq_len 64
  std::string out;
  for (int i = 0; i < examples; ++i) {
    auto half = [&](int k) { const auto& l = lines[static_cast<size_t>(k) % lines.size()]; return l.substr(l.size() / 2); };
    const std::string& l = lines[static_cast<size_t>(i)];
    nlohmann::json choices = nlohmann::json::array();
    const int label = i % 4;
    for (int c = 0; c < 4; ++c) choices.push_back(c == label ? l.substr(l.size() / 2) : half(i + 7 * (c + 1)));
    out += nlohmann::json({{"context", l.substr(0, l.size() / 2)}, {"choices", choices}, {"label", label}}).dump() + "\n";
  }
  test::write_text(path, out);
  return path;
}

std::vector<std::string> task_args(const std::string& run, const std::string& task, std::vector<std::string> extra) {
  std::vector<std::string> a = {test::source_path("configs/tiny.yaml"), "data.train=" + test::shared_bytes_dataset(),
                                "run.dir=" + run, "log.every_steps=1", "train.threads=1",
                                "eval.tasks=[{name: cloze, path: " + task + "}]"};
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

// A bad task file stops the trainer before anything is written: exit 2, one line, FILE:LINE.
// Checked to fail with the task evaluator created after open_run_dir (the run directory then exists).
TEST(TaskEval, TrainerRefusesABadTaskFileBeforeTraining) {
  TempDir d;
  task_write(d / "bad.jsonl", {R"({"context": "a", "choices": ["b"], "label": 0})", R"({"context": "a", "choices": ["b"], "label": 1})"});
  const auto r = test::run_bin("trainer", task_args(d / "run", d / "bad.jsonl", {"train.max_steps=2"}));
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find(d / "bad.jsonl:2: \"label\" 1 is out of range: 1 choices"), std::string::npos) << r.out;
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;
  EXPECT_FALSE(std::filesystem::exists(d / "run")) << "nothing written";
}

std::vector<nlohmann::json> task_records(const std::string& run) {
  std::vector<nlohmann::json> out;
  for (const auto& l : test::metrics_of_kind(run + "/metrics.jsonl", "task")) out.push_back(nlohmann::json::parse(l));
  return out;
}

// A real run: a task record at the start (step 0), every eval.every_steps and at the end, with
// every field; summary.json and the last log line carry the accuracy; TensorBoard has the tags.
// Checked to fail with the start's scoring removed from Trainer::run.
TEST(TaskEval, TrainerRunRecordsTheScores) {
  TempDir d;
  const std::string task = task_cloze(d / "cloze.jsonl", 21);
  auto p = test::spawn_bin("trainer", task_args(d / "run", task, {"train.max_steps=4", "eval.every_steps=2"}), d / "out",
                           {"OMP_NUM_THREADS=1"});
  ASSERT_EQ(test::wait_proc(p), 0) << test::read_text(d / "out");
  const auto recs = task_records(d / "run");
  ASSERT_EQ(recs.size(), 3u) << test::read_text(d / "run/metrics.jsonl");
  const std::vector<int64_t> steps = {0, 2, 4};
  for (size_t i = 0; i < recs.size(); ++i) {
    EXPECT_EQ(recs[i]["step"].get<int64_t>(), steps[i]);
    EXPECT_EQ(recs[i]["task"], "cloze");
    EXPECT_EQ(recs[i]["task_examples"], 21);
    EXPECT_EQ(recs[i]["task_truncated"], 0);
    for (const char* f : {"task_acc", "task_acc_norm"}) {
      const double v = recs[i][f].get<double>();
      EXPECT_GE(v, 0);
      EXPECT_LE(v, 1);
      EXPECT_DOUBLE_EQ(v * 21, std::round(v * 21)) << "a count of 21 examples";
    }
  }
  const auto sum = nlohmann::json::parse(test::read_text(d / "run/summary.json"));
  ASSERT_TRUE(sum.contains("tasks")) << sum.dump();
  EXPECT_EQ(sum["tasks"]["cloze"]["acc"], recs.back()["task_acc"]);
  EXPECT_EQ(sum["tasks"]["cloze"]["first_acc"], recs.front()["task_acc"]);
  EXPECT_EQ(sum["tasks"]["cloze"]["acc_norm"], recs.back()["task_acc_norm"]);
  const std::string out = test::read_text(d / "out");
  EXPECT_NE(out.find("| cloze acc "), std::string::npos) << out;
  EXPECT_NE(out.find("task cloze: 21 examples, 84 choices"), std::string::npos) << out;
  bool tags = false;
  for (const auto& f : std::filesystem::directory_iterator(d.path() + "/run"))
    if (f.path().filename().string().rfind("events.out.tfevents", 0) == 0)
      tags = test::read_text(f.path().string()).find("task/cloze/acc_norm") != std::string::npos;
  EXPECT_TRUE(tags);
}

// 2 ranks over Gloo (each scoring its examples, 11 of them: uneven) give the 1-rank scores: at the
// start exactly (the same initial weights), at the end within the runs' rounding (the same counts).
// Checked to fail with every rank scoring all the examples (counts doubled).
TEST(TaskEval, TwoRanksScoreAsOne) {
  TempDir d;
  const std::string task = task_cloze(d / "cloze.jsonl", 11);
  auto p = test::spawn_bin("trainer", task_args(d / "one", task, {"train.max_steps=3", "train.micro_batch_size=8"}),
                           d / "out1", {"OMP_NUM_THREADS=1"});
  ASSERT_EQ(test::wait_proc(p), 0) << test::read_text(d / "out1");
  const int port = test::free_port();
  std::vector<test::Proc> ranks;
  for (int r = 0; r < 2; ++r)
    ranks.push_back(test::spawn_bin("trainer", task_args(d / "two", task, {"train.max_steps=3", "train.micro_batch_size=4"}),
                                    d / ("out2_" + std::to_string(r)), test::rank_env(r, 2, port)));
  for (auto& r : ranks) ASSERT_EQ(test::wait_proc(r), 0) << test::read_text(d / "out2_0");
  const auto a = task_records(d / "one"), b = task_records(d / "two");
  ASSERT_EQ(a.size(), 2u);
  ASSERT_EQ(b.size(), 2u);
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i]["step"], b[i]["step"]);
    EXPECT_EQ(a[i]["task_examples"], 11);
    EXPECT_EQ(b[i]["task_examples"], 11);
    EXPECT_EQ(a[i]["task_acc"], b[i]["task_acc"]) << "step " << a[i]["step"];
    EXPECT_EQ(a[i]["task_acc_norm"], b[i]["task_acc_norm"]) << "step " << a[i]["step"];
  }
}

}  // namespace
}  // namespace lm
