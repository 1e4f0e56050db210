// Downstream multiple-choice tasks (see task_eval.h).
#include "trainer/eval/task_eval.h"

#include <nlohmann/json.hpp>

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "common/torch/compat.h"
#include "common/errors.h"
#include "common/files.h"
#include "common/log.h"
#include "trainer/comm/process_group.h"

namespace lm {

std::vector<McExample> read_mc_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw DataError(path + ": cannot open the task file (eval.tasks)");
  std::vector<McExample> out;
  std::string line;
  int64_t no = 0;
  while (std::getline(in, line)) {
    ++no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    auto fail = [&](const std::string& why) { throw DataError(path + ":" + std::to_string(no) + ": " + why); };
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) fail("not valid JSON");
    if (!j.is_object()) fail("expected a JSON object {\"context\", \"choices\", \"label\"}");
    McExample e;
    auto c = j.find("context");
    if (c == j.end()) fail("no \"context\"");
    if (!c->is_string()) fail("\"context\" is not a string");
    e.context = c->get<std::string>();
    auto ch = j.find("choices");
    if (ch == j.end()) fail("no \"choices\"");
    if (!ch->is_array()) fail("\"choices\" is not a list");
    if (ch->empty()) fail("\"choices\" is empty");
    for (size_t i = 0; i < ch->size(); ++i) {
      if (!(*ch)[i].is_string()) fail("choice " + std::to_string(i) + " is not a string");
      e.choices.push_back((*ch)[i].get<std::string>());
      if (e.choices.back().empty()) fail("choice " + std::to_string(i) + " is empty");
    }
    auto l = j.find("label");
    if (l == j.end()) fail("no \"label\"");
    if (!l->is_number_integer()) fail("\"label\" is not an integer");
    e.label = l->get<int64_t>();
    if (e.label < 0 || e.label >= static_cast<int64_t>(e.choices.size()))
      fail("\"label\" " + std::to_string(e.label) + " is out of range: " + std::to_string(e.choices.size()) + " choices");
    out.push_back(std::move(e));
  }
  if (in.bad()) throw DataError(path + ": read error");
  if (out.empty()) throw DataError(path + ": no example in the task file (eval.tasks)");
  return out;
}

ChoiceRow make_choice_row(const data::Tokenizer& tok, const std::string& context, const std::string& choice,
                          int64_t seq_len, bool* cut) {
  ChoiceRow r;
  r.tokens.push_back(tok.info().eos_id);
  for (auto t : tok.encode(context)) r.tokens.push_back(t);
  const auto ch = tok.encode(choice);
  for (auto t : ch) r.tokens.push_back(t);
  const size_t keep = static_cast<size_t>(seq_len) + 1;
  *cut = r.tokens.size() > keep;
  if (*cut) r.tokens.erase(r.tokens.begin(), r.tokens.end() - static_cast<std::ptrdiff_t>(keep));
  r.scored = std::min<int64_t>(static_cast<int64_t>(ch.size()), static_cast<int64_t>(r.tokens.size()) - 1);
  return r;
}

std::vector<double> score_choice_rows(LM& model, const std::vector<ChoiceRow>& rows, int64_t batch_rows,
                                      int64_t pad_id, const torch::Device& device, bool bf16, int64_t forwards) {
  torch::NoGradGuard ng;
  std::vector<double> out(rows.size(), 0.0);
  const size_t step = static_cast<size_t>(std::max<int64_t>(1, batch_rows));
  int64_t done = 0;
  for (size_t a = 0; a < rows.size(); a += step, ++done) {
    const size_t b = std::min(rows.size(), a + step);
    const int64_t B = static_cast<int64_t>(b - a);
    int64_t L = 1;
    for (size_t r = a; r < b; ++r) L = std::max<int64_t>(L, static_cast<int64_t>(rows[r].tokens.size()) - 1);
    std::vector<int64_t> in(static_cast<size_t>(B * L), pad_id), tg(static_cast<size_t>(B * L), -1);
    for (size_t r = a; r < b; ++r) {
      const auto& t = rows[r].tokens;
      const int64_t n = static_cast<int64_t>(t.size()) - 1, row = static_cast<int64_t>(r - a);
      for (int64_t j = 0; j < n; ++j) in[static_cast<size_t>(row * L + j)] = t[static_cast<size_t>(j)];
      for (int64_t j = n - rows[r].scored; j < n; ++j) tg[static_cast<size_t>(row * L + j)] = t[static_cast<size_t>(j + 1)];
    }
    auto x = torch::from_blob(in.data(), {B, L}, torch::kLong).to(device, false, true);
    auto y = torch::from_blob(tg.data(), {B, L}, torch::kLong).to(device, false, true);
    if (bf16) compat::set_autocast(device, true);
    auto h = model->hidden(x, nullptr);
    if (bf16) {
      compat::set_autocast(device, false);
      compat::clear_autocast_cache();
    }
    const auto mask = y.ge(0);
    const auto hs = h.index({mask}).to(torch::kFloat);                         // (N, C): the scored positions
    const auto logits = torch::matmul(hs, model->head_weight().to(torch::kFloat).t());  // (N, V)
    const auto lp = torch::log_softmax(logits, -1).gather(1, y.index({mask}).unsqueeze(1)).squeeze(1).to(torch::kDouble);
    const auto row_of = torch::arange(B, torch::TensorOptions().dtype(torch::kLong).device(device))
                            .unsqueeze(1).expand({B, L}).index({mask});
    const auto sums = torch::zeros({B}, torch::TensorOptions().dtype(torch::kDouble).device(device))
                          .index_add_(0, row_of, lp).cpu();
    for (int64_t r = 0; r < B; ++r) out[a + static_cast<size_t>(r)] = sums[r].item<double>();
  }
  for (; done < forwards; ++done) {  // a forward in step with the others only
    auto x = torch::full({1, 1}, pad_id, torch::kLong).to(device);
    if (bf16) compat::set_autocast(device, true);
    model->hidden(x, nullptr);
    if (bf16) {
      compat::set_autocast(device, false);
      compat::clear_autocast_cache();
    }
  }
  return out;
}

std::unique_ptr<data::Tokenizer> load_run_tokenizer(const data::TrainData& data) {
  if (data.tokenizer().kind == "bytes") return data::load_tokenizer_isolated("bytes");
  // A sentencepiece model, wherever the dataset lives: its bytes (checked against the hash) through
  // a private temporary file, which the plugin loads.
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("lm_task_tokenizer_" + std::to_string(::getpid()) + ".model")).string();
  files::write_file_atomic(path, data.tokenizer_model());
  std::unique_ptr<data::Tokenizer> tok;
  try {
    tok = data::load_tokenizer_isolated(path);
  } catch (...) {
    std::filesystem::remove(path);
    throw;
  }
  std::filesystem::remove(path);
  return tok;
}

std::unique_ptr<TaskEvaluator> TaskEvaluator::create(const EvalConfig& cfg, const data::Tokenizer& tok,
                                                     const TaskRuntime& rt) {
  if (cfg.tasks.empty()) return nullptr;
  std::unique_ptr<TaskEvaluator> e(new TaskEvaluator(rt, tok.info().pad_id));
  for (const auto& tc : cfg.tasks) {
    const auto examples = read_mc_file(tc.path);
    Task t;
    t.name = tc.name;
    t.examples = static_cast<int64_t>(examples.size());
    int64_t rows = 0;
    std::vector<int64_t> rank_rows(static_cast<size_t>(std::max(1, rt.world)), 0);  // each rank's choices
    for (size_t i = 0; i < examples.size(); ++i) {
      const auto& ex = examples[i];
      rank_rows[i % rank_rows.size()] += static_cast<int64_t>(ex.choices.size());
      const bool mine = static_cast<int>(i % static_cast<size_t>(std::max(1, rt.world))) == rt.rank;
      Example m;
      m.first_row = t.rows.size(), m.label = ex.label;
      bool any_cut = false;
      for (const auto& c : ex.choices) {
        bool cut = false;
        ChoiceRow r = make_choice_row(tok, ex.context, c, rt.seq_len, &cut);
        any_cut = any_cut || cut;
        ++rows;
        if (!mine) continue;
        t.rows.push_back(std::move(r));
        m.bytes.push_back(static_cast<int64_t>(c.size()));
      }
      t.truncated += any_cut ? 1 : 0;
      if (mine) t.mine.push_back(std::move(m));
    }
    const int64_t per = std::max<int64_t>(1, rt.batch_rows);
    for (const int64_t n : rank_rows) t.forwards = std::max(t.forwards, (n + per - 1) / per);
    if (rt.rank == 0)
      log::info(strf("task %s: %lld examples, %lld choices (%s, multiple_choice)%s", t.name.c_str(), (long long)t.examples,
                     (long long)rows, tc.path.c_str(),
                     t.truncated ? strf("; %lld examples cut from the left to model.seq_len=%lld tokens",
                                        (long long)t.truncated, (long long)rt.seq_len).c_str() : ""));
    e->tasks_.push_back(std::move(t));
  }
  return e;
}

std::vector<TaskScore> TaskEvaluator::score(LM& model, Comm* comm) {
  model->eval();
  std::vector<double> counts;  // per task: correct, correct_norm
  for (const auto& t : tasks_) {
    const auto ll = score_choice_rows(model, t.rows, rt_.batch_rows, pad_id_, rt_.device, rt_.bf16,
                                      rt_.world > 1 ? t.forwards : 0);
    double acc = 0, acc_norm = 0;
    for (const auto& ex : t.mine) {
      size_t best = 0, best_norm = 0;
      for (size_t c = 1; c < ex.bytes.size(); ++c) {
        const size_t r = ex.first_row + c;
        if (ll[r] > ll[ex.first_row + best]) best = c;
        if (ll[r] / static_cast<double>(ex.bytes[c]) >
            ll[ex.first_row + best_norm] / static_cast<double>(ex.bytes[best_norm]))
          best_norm = c;
      }
      acc += static_cast<int64_t>(best) == ex.label ? 1 : 0;
      acc_norm += static_cast<int64_t>(best_norm) == ex.label ? 1 : 0;
    }
    counts.push_back(acc), counts.push_back(acc_norm);
  }
  model->train();
  if (comm) {
    auto t = torch::tensor(counts, torch::kDouble);
    comm->all_reduce_sum(t, "all-reduce of the task scores");
    for (size_t i = 0; i < counts.size(); ++i) counts[i] = t[static_cast<int64_t>(i)].item<double>();
  }
  std::vector<TaskScore> out;
  for (size_t i = 0; i < tasks_.size(); ++i) {
    const auto& t = tasks_[i];
    const double n = static_cast<double>(std::max<int64_t>(1, t.examples));
    out.push_back({t.name, t.examples, t.truncated, counts[2 * i] / n, counts[2 * i + 1] / n});
  }
  return out;
}

}  // namespace lm
