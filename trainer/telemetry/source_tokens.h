// The realised data mixture: target tokens per source (data.sources; "train" for data.train), per
// logged window and over the whole run, for the "train" records (records::kSourceTokens,
// kSourceTokensTotal) and their target shares (kSourceTarget). Survives a resume (state key
// "source_tokens"; a source appended at the resume starts at 0).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "data/loader/loader.h"
#include "common/torch/stateful.h"

namespace lm {

class SourceTokens : public Stateful {
 public:
  explicit SourceTokens(std::vector<std::string> names) : names_(std::move(names)), window_(names_.size()), total_(names_.size()) {}
  // One micro-batch's global batch (Batch::source_tokens: every rank's rows).
  void add(const data::Batch& b);
  // Adds the window and run totals ({name: tokens}) to a "train" record; starts a new window.
  void close(nlohmann::json& rec);
  ComponentState state() const override;
  void load_state(const ComponentState* st) override;  // nullptr: a checkpoint from before mixtures

 private:
  std::vector<std::string> names_;
  std::vector<int64_t> window_, total_;
};

}  // namespace lm
