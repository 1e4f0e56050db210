// The run directory: the one description of where a run keeps its files. The trainer writes it;
// launch, sweep, report, generate and the tests read it through these names. Torch-free, header-only.
//
// RUN_DIR/
//   config.yaml                  resolved config (loads back to the same config)
//   meta.json                    how to reproduce the run and how it ended (trainer/telemetry/run_record.h)
//   tokenizer/                   the data's tokenizer as a dataset without shards (manifest.json and
//                                the sentencepiece model; data::TrainData::save_tokenizer): export
//                                and generate read it, so they work wherever the data went
//   metrics.jsonl                one JSON record per line (run/records.h)
//   summary.json                 the run's totals, written at the end
//   model.safetensors            final weights
//   events.out.tfevents.*        TensorBoard scalars
//   logs/rank_<r>.log            one log per rank (and NCCL's, nvidia-smi snapshots on CUDA)
//   checkpoints/step_<8 digits>/ full-state checkpoints (checkpoint/layout.h); *.tmp = unfinished
//   anomalies/step_<8 digits>/   the batch and provenance of an anomalous step
//   profile/                     Chrome traces of log.profile_steps
//   run.lock                     held by the running trainer (its pid inside)
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

namespace lm::run_dir {

// "step_00000042": the directory name of a step's checkpoint or anomaly dump.
inline std::string step_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step_%08lld", static_cast<long long>(step));
  return buf;
}
// The step of a step_name(), or -1 when `name` is not one (e.g. "step_00000042.tmp").
inline int64_t parse_step_name(const std::string& name) {
  if (name.size() != 13 || name.compare(0, 5, "step_") != 0) return -1;
  int64_t v = 0;
  for (size_t i = 5; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return -1;
    v = v * 10 + (name[i] - '0');
  }
  return v;
}

inline std::string config(const std::string& run) { return run + "/config.yaml"; }
inline std::string meta(const std::string& run) { return run + "/meta.json"; }
inline std::string tokenizer(const std::string& run) { return run + "/tokenizer"; }
inline std::string metrics(const std::string& run) { return run + "/metrics.jsonl"; }
inline std::string summary(const std::string& run) { return run + "/summary.json"; }
inline std::string weights(const std::string& run) { return run + "/model.safetensors"; }
inline std::string logs(const std::string& run) { return run + "/logs"; }
inline std::string rank_log(const std::string& run, int rank) { return logs(run) + "/rank_" + std::to_string(rank) + ".log"; }
inline std::string checkpoints(const std::string& run) { return run + "/checkpoints"; }
inline std::string checkpoint(const std::string& run, int64_t step) { return checkpoints(run) + "/" + step_name(step); }
// The committed checkpoints (step_<digits> directories) of a checkpoints directory, newest first:
// the one listing the checkpointer and the sweep tool share.
inline std::vector<std::pair<int64_t, std::string>> list_checkpoints(const std::string& ckpt_dir) {
  std::vector<std::pair<int64_t, std::string>> out;
  std::error_code ec;
  for (auto& e : std::filesystem::directory_iterator(ckpt_dir, ec)) {
    const int64_t step = parse_step_name(e.path().filename().string());
    if (e.is_directory() && step >= 0) out.emplace_back(step, e.path().string());
  }
  std::sort(out.begin(), out.end(), [](auto& a, auto& b) { return a.first > b.first; });
  return out;
}
inline std::string anomalies(const std::string& run) { return run + "/anomalies"; }
inline std::string anomaly(const std::string& run, int64_t step) { return anomalies(run) + "/" + step_name(step); }
inline std::string profile(const std::string& run) { return run + "/profile"; }

// Held (common/dir_lock.h) by the trainer's rank 0 while it runs in the directory.
constexpr const char* kLock = "run.lock";
// Checkpoints that did not verify, moved aside instead of deleted (checkpoint/reader.h).
inline std::string quarantine(const std::string& run) { return checkpoints(run) + "/quarantine"; }

// Inside a checkpoint directory: written last, lists every file with its size and xxh64.
constexpr const char* kCheckpointManifest = "manifest.json";

}  // namespace lm::run_dir
