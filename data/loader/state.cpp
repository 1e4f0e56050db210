// The loader's resume state: LoaderState JSON, the fingerprint and its check (see state.h).
#include "data/loader/state.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "common/errors.h"
#include "common/log.h"

namespace lm::data {
namespace {

using json = nlohmann::ordered_json;

json layout_json(const BatchLayout& l) {
  return {{"ranks", l.ranks}, {"rows", l.rows}, {"token_budget", l.token_budget},
          {"pad_multiple", l.pad_multiple}, {"anchor", l.anchor}};
}

BatchLayout layout_of(const json& l) {
  return BatchLayout{l.at("ranks").get<int64_t>(), l.at("rows").get<int64_t>(), l.at("token_budget").get<int64_t>(),
                     l.at("pad_multiple").get<int64_t>(), l.at("anchor").get<uint64_t>()};
}

void check_version(int version) {
  if (version != kLoaderStateVersion)
    throw DataError(strf("loader state: version %d, expected %d", version, kLoaderStateVersion));
}

}  // namespace

Fingerprint make_fingerprint(const DataConfig& c, const std::string& data_version, const std::string& split,
                             int64_t seq_len, uint64_t seed, uint64_t shuffle_block) {
  Fingerprint f = {{"data_version", data_version},      {"split", split},
                   {"mode", c.mode},                    {"seq_len", std::to_string(seq_len)},
                   {"seed", std::to_string(seed)},      {"shuffle", c.shuffle ? "true" : "false"},
                   {"shuffle_buffer", std::to_string(shuffle_block)}};
  if (c.bucketed()) f.emplace_back("long_docs", c.long_docs);
  return f;
}

void check_resumable(const LoaderState& s, const Fingerprint& ours) {
  check_version(s.version);
  for (const auto& [key, value] : ours) {
    const std::string& k = key;  // clang (C++17) cannot capture a structured binding
    auto it = std::find_if(s.fingerprint.begin(), s.fingerprint.end(), [&](const auto& kv) { return kv.first == k; });
    const std::string theirs = it == s.fingerprint.end() ? "(missing)" : it->second;
    if (theirs != value)
      throw DataError("loader state: field '" + key + "' differs: the state has " + theirs + ", this run " + value);
  }
}

nlohmann::json LoaderState::to_value() const {
  json j;
  j["version"] = version;
  j["cursor"] = cursor;
  j["batches"] = batches;
  j["fingerprint"] = json::object();
  for (const auto& [k, v] : fingerprint) j["fingerprint"][k] = v;
  j["layout"] = layout_json(layout);
  j["block_layout"] = layout_json(block_layout);
  if (!mix.empty()) j["mix"] = json::parse(mix);
  return nlohmann::json(j);
}

LoaderState LoaderState::from_json(const std::string& text) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw DataError(std::string("loader state: malformed (") + e.what() + ")");
  }
  return from_value(j);
}

LoaderState LoaderState::from_value(const nlohmann::json& value) {
  try {
    const json j = value;
    LoaderState s;
    s.version = j.at("version").get<int>();
    check_version(s.version);
    s.cursor = j.at("cursor").get<uint64_t>();
    s.batches = j.at("batches").get<uint64_t>();
    for (const auto& [k, v] : j.at("fingerprint").items()) s.fingerprint.emplace_back(k, v.get<std::string>());
    s.layout = layout_of(j.at("layout"));
    s.block_layout = layout_of(j.at("block_layout"));
    if (j.contains("mix")) s.mix = j.at("mix").dump();
    return s;
  } catch (const json::exception& e) {
    throw DataError(std::string("loader state: malformed (") + e.what() + ")");
  }
}

}  // namespace lm::data
