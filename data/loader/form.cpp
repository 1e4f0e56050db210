// The two data forms (see form.h): everything data.train's one stream and a mixture do differently.
#include "data/loader/form.h"

#include "common/checksum.h"
#include "common/errors.h"

namespace lm::data {

namespace {

// data.train: the one source "train", planned as one stream (loader.h).
class OneStream final : public DataForm {
 public:
  std::string source_key(const DataConfig&, size_t) const override { return "data.train"; }

  void describe(const DataConfig&, TrainData& d) const override {
    d.version = d.sources.at(0).data_version;
    d.resume_version = d.version;
    d.mixture = nullptr;
  }

  PlannedStream plan(const DataConfig& c, const std::vector<const ShardSet*>& sets, const std::vector<Manifest>& sources,
                     const StreamArgs& a) const override {
    auto p = std::make_unique<Planner>(c, *sets.at(0), a.seq_len, a.micro_batch, a.rank, a.world, a.seed, a.step_block);
    PlannedStream s;
    s.samples_per_epoch = p->samples_per_epoch();
    s.shuffle_block = p->shuffle_block();
    s.fingerprint = make_fingerprint(c, sources.at(0).data_version, a.split, a.seq_len, a.seed, s.shuffle_block);
    s.fresh_on_other_data = true;
    s.planner = std::move(p);
    return s;
  }
};

// data.sources: the sources blended by tokens, in stages (mix.h).
class Mixture final : public DataForm {
 public:
  std::string source_key(const DataConfig& c, size_t i) const override {
    return "data.sources." + c.sources.at(i).name + ".path";
  }

  void describe(const DataConfig& c, TrainData& d) const override {
    std::string text;
    for (size_t i = 0; i < c.sources.size(); ++i)
      text += strf("source %s %s %.17g %lld\n", c.sources[i].name.c_str(), d.sources.at(i).data_version.c_str(),
                   c.sources[i].weight, static_cast<long long>(c.sources[i].max_epochs));
    for (const auto& st : c.stages) {
      text += strf("stage %lld %lld", static_cast<long long>(st.until_step), static_cast<long long>(st.until_tokens));
      for (const auto& [name, w] : st.weights) text += strf(" %s %.17g", name.c_str(), w);
      text += "\n";
    }
    d.version = hex64(xxh64(text.data(), text.size()));
    d.resume_version = "";
    nlohmann::json src = nlohmann::json::array(), stages = nlohmann::json::array();
    for (size_t i = 0; i < c.sources.size(); ++i)
      src.push_back({{"name", c.sources[i].name}, {"path", c.sources[i].path},
                     {"data_version", d.sources.at(i).data_version}, {"weight", c.sources[i].weight},
                     {"max_epochs", c.sources[i].max_epochs}, {"train_tokens", d.sources.at(i).split_tokens("train")}});
    for (const auto& st : c.stages) {
      nlohmann::json w = nlohmann::json::object();
      for (const auto& [name, v] : st.weights) w[name] = v;
      stages.push_back({{"until", st.until_step}, {"until_tokens", st.until_tokens}, {"weights", w}});
      if (st.anneal) stages.back()["anneal"] = true;
    }
    d.mixture = {{"sources", src}, {"stages", stages}, {"data_version", d.version}};
  }

  PlannedStream plan(const DataConfig& c, const std::vector<const ShardSet*>& sets, const std::vector<Manifest>& sources,
                     const StreamArgs& a) const override {
    std::vector<MixSource> mix;
    for (size_t i = 0; i < sources.size(); ++i) mix.push_back({sets.at(i), sources[i].data_version});
    const std::string hash = sources.at(0).tokenizer.hash;
    auto p = std::make_unique<MixPlanner>(c, mix, hash, a.seq_len, a.micro_batch, a.rank, a.world, a.seed,
                                          a.micro_per_step, a.step_block);
    PlannedStream s;
    s.counter = [c, mix, hash, a] {
      auto q = std::make_unique<MixPlanner>(c, mix, hash, a.seq_len, a.micro_batch, a.rank, a.world, a.seed,
                                            a.micro_per_step, a.step_block);
      q->set_quiet();
      return q;
    };
    s.samples_per_epoch = p->samples_per_epoch(0);
    s.shuffle_block = static_cast<uint64_t>(c.shuffle_buffer);
    s.fingerprint = make_fingerprint(c, "mixture", a.split, a.seq_len, a.seed, s.shuffle_block);
    s.planner = std::move(p);
    return s;
  }
};

}  // namespace

const DataForm& data_form(const DataConfig& c) {
  static const OneStream one_stream;
  static const Mixture mixture;
  if (c.train_form) return one_stream;
  return mixture;
}

}  // namespace lm::data
