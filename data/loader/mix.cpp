// The loader's data mixture: the token-weighted choice of source, stages, caps and the resume of an
// edited mixture (see mix.h; the rules are loader.h's MIXTURES).
#include "data/loader/mix.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "common/checksum.h"
#include "common/errors.h"
#include "common/log.h"

namespace lm::data {
namespace {

using json = nlohmann::ordered_json;

uint64_t source_seed(uint64_t seed, const std::string& name) {
  const uint64_t ints[2] = {seed, xxh64(name.data(), name.size())};
  return xxh64(ints, sizeof ints);
}

std::string percent_list(const MixState& st) {
  std::string out;
  for (const auto& s : st.sources) out += strf("%s%s %.1f%%", out.empty() ? "" : ", ", s.name.c_str(), 100 * s.weight);
  return out;
}

}  // namespace

// ---- state -------------------------------------------------------------------------------------

std::string MixState::to_json() const {
  json j = {{"tokenizer", tokenizer}, {"stage", stage}, {"seg_start", seg_start}, {"seg_total", seg_total},
            {"total", total}, {"sources", json::array()}};
  for (const auto& s : sources)
    j["sources"].push_back({{"name", s.name}, {"data_version", s.data_version}, {"cursor", s.cursor},
                            {"tokens", s.tokens}, {"seg_tokens", s.seg_tokens}, {"weight", s.weight}});
  return j.dump();
}

MixState MixState::from_json(const std::string& text) {
  try {
    const json j = json::parse(text);
    MixState st;
    st.tokenizer = j.at("tokenizer").get<std::string>();
    st.stage = j.at("stage").get<int64_t>();
    st.seg_start = j.at("seg_start").get<uint64_t>();
    st.seg_total = j.at("seg_total").get<int64_t>();
    st.total = j.at("total").get<int64_t>();
    for (const auto& s : j.at("sources"))
      st.sources.push_back({s.at("name").get<std::string>(), s.at("data_version").get<std::string>(),
                            s.at("cursor").get<uint64_t>(), s.at("tokens").get<int64_t>(),
                            s.at("seg_tokens").get<int64_t>(), s.at("weight").get<double>()});
    return st;
  } catch (const json::exception& e) {
    throw DataError(std::string("loader state: malformed mixture (") + e.what() + ")");
  }
}

// ---- the planner -------------------------------------------------------------------------------

MixPlanner::MixPlanner(const DataConfig& c, const std::vector<MixSource>& sources, const std::string& tokenizer_hash,
                       int64_t seq_len, int64_t micro_batch, int rank, int world, uint64_t seed, int64_t micro_per_step,
                       int64_t step_block)
    : c_(c), bucketed_(c.bucketed()), T_(seq_len), B_(micro_batch), accum_(std::max<int64_t>(1, micro_per_step)),
      rank_(rank), world_(world), step_block_(step_block) {
  if (step_block_ > 0 && bucketed_ && c.token_budget > 0)
    throw Error("MixPlanner: step blocks (dist.invariant) need micro-batches of micro_batch rows (no data.token_budget)");
  step_.served = step_block_;  // the first call plans a step
  st_.tokenizer = tokenizer_hash;
  for (size_t i = 0; i < sources.size(); ++i) {
    Stream s{&c_.sources[i], std::make_unique<Planner>(c, *sources[i].set, seq_len, 1, 0, 1, source_seed(seed, c_.sources[i].name)), 0};
    s.n = s.planner->samples_per_epoch();
    streams_.push_back(std::move(s));
    st_.sources.push_back({c_.sources[i].name, sources[i].data_version, 0, 0, 0, 0});
  }
  own_.ranks = world;
  if (bucketed_ && c.token_budget > 0) {
    own_.token_budget = c.token_budget;
    own_.pad_multiple = c.pad_multiple;
  } else {
    own_.rows = micro_batch;
  }
}

// The stage in effect for `batch`, given the tokens before it; -1 without stages.
int64_t MixPlanner::stage_of(uint64_t batch, int64_t tokens_before) const {
  const auto& stages = c_.stages;
  for (size_t i = 0; i < stages.size(); ++i) {
    const auto& s = stages[i];
    if (s.until_step > 0 && batch < static_cast<uint64_t>(s.until_step * accum_)) return static_cast<int64_t>(i);
    if (s.until_tokens > 0 && tokens_before < s.until_tokens) return static_cast<int64_t>(i);
    if (s.until_step == 0 && s.until_tokens == 0) return static_cast<int64_t>(i);
  }
  return static_cast<int64_t>(stages.size()) - 1;
}

bool MixPlanner::capped(size_t s) const {
  const int64_t cap = streams_[s].config->max_epochs;
  return cap > 0 && st_.sources[s].cursor >= static_cast<uint64_t>(cap) * streams_[s].n;
}

std::vector<double> MixPlanner::weights_of(int64_t stage) const {
  std::vector<double> w(streams_.size(), 0.0);
  for (size_t s = 0; s < streams_.size(); ++s) w[s] = streams_[s].config->weight;
  if (stage >= 0) {
    std::fill(w.begin(), w.end(), 0.0);
    for (const auto& [name, v] : c_.stages[static_cast<size_t>(stage)].weights)
      for (size_t s = 0; s < streams_.size(); ++s)
        if (streams_[s].config->name == name) w[s] = v;
  }
  double sum = 0;
  for (size_t s = 0; s < w.size(); ++s) sum += capped(s) ? (w[s] = 0) : w[s];
  if (!(sum > 0)) return {};
  for (double& v : w) v /= sum;
  return w;
}

void MixPlanner::begin_segment(int64_t stage, const std::string& why) {
  const std::vector<double> w = weights_of(stage);
  exhausted_ = w.empty();
  if (w.empty())
    throw DataError(strf("data: no source left to read at batch %llu (%s): every source with a weight has reached its "
                         "max_epochs", static_cast<unsigned long long>(batches_), why.c_str()));
  st_.stage = stage;
  st_.seg_start = batches_;
  st_.seg_total = 0;
  for (size_t s = 0; s < w.size(); ++s) st_.sources[s].weight = w[s], st_.sources[s].seg_tokens = 0;
  if (rank_ == 0 && !quiet_)
    log::info(strf("data: mixture from batch %llu (%s): %s", static_cast<unsigned long long>(batches_), why.c_str(),
                   percent_list(st_).c_str()));
}

size_t MixPlanner::pick() const {
  size_t best = streams_.size();
  double best_d = 0;
  for (size_t s = 0; s < streams_.size(); ++s) {
    const auto& src = st_.sources[s];
    if (!(src.weight > 0)) continue;
    const double d = src.weight * static_cast<double>(st_.seg_total + T_) - static_cast<double>(src.seg_tokens);
    if (best == streams_.size() || d > best_d) best = s, best_d = d;
  }
  return best;
}

// The next sample of source s: logs a new epoch, counts its tokens, renormalises at its cap.
Plan::Row MixPlanner::take(size_t s, Plan& p, int64_t* tokens) {
  auto& src = st_.sources[s];
  const uint64_t n = streams_[s].n;
  if (src.cursor > 0 && src.cursor % n == 0 && rank_ == 0 && !quiet_)
    log::info(strf("data: source '%s' starts epoch %llu at batch %llu%s", src.name.c_str(),
                   static_cast<unsigned long long>(src.cursor / n), static_cast<unsigned long long>(batches_),
                   c_.shuffle ? " (reshuffled)" : ""));
  Plan::Row row = streams_[s].planner->sample(src.cursor, p, tokens);
  row.source = static_cast<uint32_t>(s);
  ++src.cursor;
  src.tokens += *tokens, src.seg_tokens += *tokens;
  st_.total += *tokens, st_.seg_total += *tokens;
  if (capped(s))
    begin_segment(st_.stage, strf("source '%s' reached max_epochs=%lld after %llu samples; renormalised", src.name.c_str(),
                                  static_cast<long long>(streams_[s].config->max_epochs),
                                  static_cast<unsigned long long>(src.cursor)));
  return row;
}

Plan MixPlanner::next() {
  if (step_block_ > 0) return next_in_step();
  Plan p;
  std::vector<Plan::Row> rows = plan_global(p);
  if (bucketed_) {  // longest first, dealt to ranks round-robin (loader.h); a budget's G is a multiple of the ranks
    longest_first(rows);
    for (size_t i = static_cast<size_t>(rank_); i < rows.size(); i += static_cast<size_t>(world_)) p.rows.push_back(rows[i]);
  } else {
    p.rows.assign(rows.begin() + rank_ * B_, rows.begin() + (rank_ + 1) * B_);
  }
  forget_and_read_ahead();
  p.cursor_after = cursor_;
  p.mix_after = std::make_shared<const MixState>(st_);
  return p;
}

void MixPlanner::enter_stage() {
  // Step blocks: the batches of W*B samples before this step (steps x A), whatever the world size.
  const uint64_t batch = step_block_ > 0 ? cursor_ / static_cast<uint64_t>(world_ * B_) : batches_;
  const int64_t stage = stage_of(batch, st_.total);
  const std::vector<double> w = weights_of(stage);
  bool same = stage == st_.stage && !w.empty();
  for (size_t s = 0; same && s < w.size(); ++s) same = w[s] == st_.sources[s].weight;
  if (!same)
    begin_segment(stage, st_.stage == -2 ? "start"
                         : resumed_      ? "the mixture changed at resume"
                                         : strf("stage %lld", static_cast<long long>(stage + 1)));
  resumed_ = false;
}

void MixPlanner::forget_and_read_ahead() {
  for (size_t s = 0; s < streams_.size(); ++s) {
    streams_[s].planner->forget_before(st_.sources[s].cursor);
    streams_[s].planner->read_ahead_from(st_.sources[s].cursor);  // remote and raw-text sources fetch ahead
  }
}

void MixPlanner::longest_first(std::vector<Plan::Row>& rows) {
  std::stable_sort(rows.begin(), rows.end(), [](const Plan::Row& a, const Plan::Row& b) { return a.ref.len > b.ref.len; });
}

std::vector<Plan::Row> MixPlanner::draw(uint64_t n, Plan& p, std::vector<int64_t>* row_tokens) {
  p.source_tokens.assign(streams_.size(), 0);
  std::vector<Plan::Row> rows;
  for (uint64_t j = 0; j < n; ++j) {
    const size_t s = pick();
    if (s == streams_.size()) begin_segment(st_.stage, "no source left");  // throws
    if (j == 0) p.epoch = static_cast<int64_t>(st_.sources[s].cursor / streams_[s].n);
    int64_t tokens = 0;
    rows.push_back(take(s, p, &tokens));
    p.source_tokens[s] += tokens;
    if (row_tokens) row_tokens->push_back(tokens);
  }
  cursor_ += n;
  return rows;
}

void MixPlanner::plan_step() {
  enter_stage();
  step_ = Step{};
  step_.start = cursor_;
  Plan scratch;  // gathers the rows' epoch tables
  step_.rows = draw(static_cast<uint64_t>(world_ * step_block_ * B_), scratch, &step_.tokens);
  step_.epoch = scratch.epoch;
  step_.keep = std::move(scratch.keep);
  batches_ += static_cast<uint64_t>(step_block_);
  forget_and_read_ahead();
  step_.after = std::make_shared<const MixState>(st_);
}

// Rank r's k-th call of the step: global micro-batch r*A + k; its source tokens those of the W
// micro-batches the ranks take at this call (the step's A calls add up to the step's tokens).
Plan MixPlanner::next_in_step() {
  const int64_t A = step_block_;
  if (step_.served == A) plan_step();
  const int64_t k = step_.served++;
  Plan p;
  p.epoch = step_.epoch;
  p.keep = step_.keep;
  p.source_tokens.assign(streams_.size(), 0);
  for (int r = 0; r < world_; ++r) {
    const auto first = static_cast<size_t>(step_block(r, A).at(k) * B_);
    for (size_t i = first; i < first + static_cast<size_t>(B_); ++i) {
      p.source_tokens[step_.rows[i].source] += step_.tokens[i];
      if (r == rank_) p.rows.push_back(step_.rows[i]);
    }
  }
  if (bucketed_) longest_first(p.rows);  // as a micro-batch of one rank is sorted
  p.cursor_after = step_.start + static_cast<uint64_t>((k + 1) * world_ * B_);
  p.mix_after = step_.after;
  return p;
}

std::vector<Plan::Row> MixPlanner::plan_global(Plan& p) {
  enter_stage();
  const uint64_t G = own_.token_budget > 0 ? budget_rows() : static_cast<uint64_t>(world_ * B_);
  std::vector<Plan::Row> rows = draw(G, p, nullptr);
  ++batches_;
  return rows;
}

bool MixPlanner::can_end() const {
  auto all_capped = [&](const std::vector<double>& w) {
    bool any = false;
    for (size_t s = 0; s < w.size(); ++s)
      if (w[s] > 0) {
        if (streams_[s].config->max_epochs <= 0) return false;
        any = true;
      }
    return any;
  };
  std::vector<double> w(streams_.size(), 0.0);
  if (c_.stages.empty()) {
    for (size_t s = 0; s < streams_.size(); ++s) w[s] = streams_[s].config->weight;
    return all_capped(w);
  }
  for (const auto& stage : c_.stages) {
    std::fill(w.begin(), w.end(), 0.0);
    for (const auto& [name, v] : stage.weights)
      for (size_t s = 0; s < streams_.size(); ++s)
        if (streams_[s].config->name == name) w[s] = v;
    if (all_capped(w)) return true;
  }
  return false;
}

uint64_t MixPlanner::batches_left(uint64_t limit, uint64_t max_samples) {
  if (!can_end()) return limit;
  quiet_ = true;
  const uint64_t start = cursor_;
  for (uint64_t n = 0; n < limit; ++n) {
    if (cursor_ - start > max_samples) return limit;  // not known cheaply: the run finds out (train.cpp)
    try {
      if (step_block_ > 0) {  // whole steps of A batches
        plan_step();
        n += static_cast<uint64_t>(step_block_) - 1;
        continue;
      }
      Plan p;
      plan_global(p);
    } catch (const DataError&) {
      if (exhausted_) return n;
      throw;
    }
    for (size_t s = 0; s < streams_.size(); ++s) streams_[s].planner->forget_before(st_.sources[s].cursor);
  }
  return limit;
}

// Bucketed with data.token_budget: the global batch takes the mixture's next samples in groups of
// one per rank while k groups fit, k * padded(longest) <= budget (at least one group), as the one-
// source planner cuts its blocks (plan.cpp budget_cuts). Tried on a copy of the state, quietly.
uint64_t MixPlanner::budget_rows() {
  const MixState start = st_;
  const size_t W = static_cast<size_t>(world_);
  const bool was_quiet = quiet_;
  quiet_ = true;
  uint64_t k = 0;
  uint32_t longest = 0;
  try {
    for (bool fits = true; fits; ) {
      uint32_t m = longest;
      for (size_t j = 0; j < W; ++j) {
        const size_t s = pick();
        if (s == streams_.size()) throw DataError("no source left");  // the real take says it
        Plan scratch;
        int64_t tokens = 0;
        m = std::max(m, take(s, scratch, &tokens).ref.len);
      }
      const int64_t per_row = std::max<int64_t>(1, padded(m, own_.pad_multiple, T_));
      fits = k == 0 || static_cast<int64_t>(k + 1) * per_row <= own_.token_budget;
      if (fits) ++k, longest = m;
    }
  } catch (const DataError&) {
    k = std::max<uint64_t>(k, 1);
  }
  quiet_ = was_quiet;
  st_ = start;
  return k * W;
}

// ---- resume ------------------------------------------------------------------------------------

void MixPlanner::save(LoaderState& s) const { s.layout = s.block_layout = own_; }

void MixPlanner::restart(const LoaderState& s, bool force) {
  if (s.mix.empty()) throw DataError("loader state: the checkpoint's data was not a mixture (data.sources)");
  const MixState old = MixState::from_json(s.mix);
  auto refuse = [&](const std::string& what) {
    if (!force) throw DataError("loader state: " + what + " (checkpoint.force=true continues anyway)");
    if (!quiet_) log::warn("loader state: " + what + ": continuing (checkpoint.force)");
  };
  if (old.tokenizer != st_.tokenizer)
    refuse("the tokenizer changed: hash " + old.tokenizer + " in the checkpoint, " + st_.tokenizer + " now");
  MixState now = st_;
  for (auto& src : now.sources) src = {src.name, src.data_version, 0, 0, 0, 0};
  for (const auto& o : old.sources) {
    auto it = std::find_if(now.sources.begin(), now.sources.end(), [&](const auto& n) { return n.name == o.name; });
    if (it == now.sources.end()) {
      if (o.cursor > 0)
        refuse(strf("source '%s' was read (%llu samples) and is missing from data.sources", o.name.c_str(),
                    static_cast<unsigned long long>(o.cursor)));
      continue;
    }
    if (o.data_version != it->data_version) {
      refuse("source '" + o.name + "' changed: data version " + o.data_version + " in the checkpoint, " +
             it->data_version + " now");
      continue;  // forced: read from its start
    }
    *it = o;
  }
  for (const auto& n : now.sources)
    if (!quiet_ && std::none_of(old.sources.begin(), old.sources.end(), [&](const auto& o) { return o.name == n.name; }))
      log::info(strf("data: source '%s' appended at batch %llu", n.name.c_str(), static_cast<unsigned long long>(s.batches)));
  now.stage = old.stage, now.seg_start = old.seg_start, now.seg_total = old.seg_total, now.total = old.total;
  st_ = now;
  cursor_ = s.cursor;
  batches_ = s.batches;
  resumed_ = true;
  step_ = Step{};
  step_.served = step_block_;  // step blocks: the next call plans the step from here
  for (size_t i = 0; i < streams_.size(); ++i) {
    LoaderState at;
    at.cursor = st_.sources[i].cursor;
    streams_[i].planner->restart(at, force);
  }
}

}  // namespace lm::data
