// Anomaly detection and evidence (see anomaly.h).
#include "trainer/telemetry/anomaly.h"

#include <algorithm>
#include <cmath>

#include "common/checksum.h"
#include "common/files.h"
#include "common/log.h"
#include "run/run_dir.h"

namespace lm {

std::string AnomalyDetector::check(int64_t step, double loss, double gnorm) {
  if (!std::isfinite(loss)) return strf("non-finite loss (%g)", loss);
  if (!std::isfinite(gnorm)) return strf("non-finite grad norm (%g)", gnorm);
  double mean = 0;
  for (double l : recent_) mean += l;
  if (!recent_.empty()) mean /= static_cast<double>(recent_.size());
  const bool spike = cfg_.spike_factor > 0 && step > cfg_.warmup_steps &&
                     static_cast<int64_t>(recent_.size()) >= std::min<int64_t>(cfg_.window, 10) &&
                     loss > cfg_.spike_factor * mean;
  if (spike) return strf("loss spike: %.4f > %.2f x running mean %.4f", loss, cfg_.spike_factor, mean);
  recent_.push_back(loss);
  if (static_cast<int64_t>(recent_.size()) > cfg_.window) recent_.pop_front();
  return "";
}

ComponentState AnomalyDetector::state() const {
  ComponentState st;
  st.values = {{"recent_losses", std::vector<double>(recent_.begin(), recent_.end())}};
  return st;
}

void AnomalyDetector::load_state(const ComponentState* in) {
  const ComponentState& st = *in;
  recent_.clear();
  for (double l : st.values.value("recent_losses", std::vector<double>{})) recent_.push_back(l);
}

nlohmann::json finite_or_null(double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr); }

namespace {

nlohmann::json batch_rows(const data::Batch& b, const std::vector<data::Manifest>& sources) {
  nlohmann::json rows = nlohmann::json::array();
  for (int64_t r = 0; r < b.rows; ++r) {
    const auto& o = b.origins[static_cast<size_t>(r)];
    rows.push_back({{"inputs", std::vector<int64_t>(b.inputs.begin() + r * b.cols, b.inputs.begin() + (r + 1) * b.cols)},
                    {"targets", std::vector<int64_t>(b.targets.begin() + r * b.cols, b.targets.begin() + (r + 1) * b.cols)},
                    {"source", o.source}, {"data_dir", sources.at(o.source).dir}, {"shard", o.shard},
                    {"shard_file", sources.at(o.source).shards.at(o.shard).file}, {"doc", o.doc},
                    {"offset", o.offset}});
  }
  return rows;
}

}  // namespace

void write_anomaly_evidence(const std::string& run_dir, int rank, const AnomalyFacts& f,
                            const std::vector<data::Batch>& batches, const std::vector<data::Manifest>& sources) {
  const data::Manifest& manifest = sources.at(0);
  const std::string dir = run_dir::anomaly(run_dir, f.step);
  files::make_dirs(dir);
  nlohmann::json micro = nlohmann::json::array();
  for (const auto& b : batches)
    micro.push_back({{"batch_index", b.index}, {"epoch", b.epoch}, {"hash", hex64(b.hash)}, {"rows", batch_rows(b, sources)}});
  files::write_file_atomic(dir + "/rank_" + std::to_string(rank) + ".json",
                           nlohmann::json{{"step", f.step}, {"rank", rank}, {"data_dir", manifest.dir},
                                          {"data_version", manifest.data_version}, {"micro_batches", micro}}
                               .dump() + "\n");
  if (rank != 0) return;
  files::write_file_atomic(dir + "/step.json",
                           nlohmann::json{{"step", f.step}, {"reason", f.reason}, {"action", f.action},
                                          {"loss", finite_or_null(f.loss)}, {"grad_norm", finite_or_null(f.grad_norm)},
                                          {"lr", f.lr}, {"world_size", f.world_size}, {"batch_hash", hex64(f.batch_hash)},
                                          {"recent_losses", f.recent_losses}, {"config", f.config}}
                               .dump(2) + "\n");
}

}  // namespace lm
