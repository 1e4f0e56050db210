// The realised data mixture's counters (see source_tokens.h).
#include "trainer/telemetry/source_tokens.h"

#include "run/records.h"

namespace lm {

void SourceTokens::add(const data::Batch& b) {
  for (size_t s = 0; s < b.source_tokens.size() && s < window_.size(); ++s)
    window_[s] += b.source_tokens[s], total_[s] += b.source_tokens[s];
}

void SourceTokens::close(nlohmann::json& rec) {
  nlohmann::json w = nlohmann::json::object(), t = nlohmann::json::object();
  for (size_t s = 0; s < names_.size(); ++s) w[names_[s]] = window_[s], t[names_[s]] = total_[s];
  rec[records::kSourceTokens] = w;
  rec[records::kSourceTokensTotal] = t;
  std::fill(window_.begin(), window_.end(), 0);
}

ComponentState SourceTokens::state() const {
  ComponentState st;
  for (size_t s = 0; s < names_.size(); ++s) st.values[names_[s]] = {{"window", window_[s]}, {"total", total_[s]}};
  return st;
}

void SourceTokens::load_state(const ComponentState* st) {
  if (!st) return;
  for (size_t s = 0; s < names_.size(); ++s) {
    auto it = st->values.find(names_[s]);
    if (it == st->values.end()) continue;
    window_[s] = it->at("window").get<int64_t>(), total_[s] = it->at("total").get<int64_t>();
  }
}

}  // namespace lm
