// Checkpoint reading: the manifest, verification, the resume point, loading and the quarantine
// (see reader.h).
#include "trainer/checkpoint/reader.h"

#include <nlohmann/json.hpp>

#include <filesystem>
#include <functional>
#include <map>
#include <mutex>

#include "common/checksum.h"
#include "common/errors.h"
#include "common/files.h"
#include "common/log.h"
#include "trainer/checkpoint/layout.h"
#include "trainer/checkpoint/safetensors.h"
#include "run/run_dir.h"

namespace lm {
namespace {

// manifest.json's files: name -> {bytes, xxh64}. "" in *why when the manifest is valid and every
// file it lists exists with its size (a cheap check); checksums are left to the reader. A manifest
// of another format version sets *other_version (refused, never skipped).
using ManifestFiles = std::map<std::string, std::pair<uint64_t, std::string>>;
// The manifest's own facts, for load() to compare with state.json's (the manifest has no checksum).
struct ManifestHead {
  int64_t step = -1, world_size = -1;
};
ManifestFiles read_manifest(const std::string& dir, std::string* why, bool* other_version = nullptr,
                            ManifestHead* head = nullptr) {
  ManifestFiles files;
  nlohmann::json m;
  try {
    m = nlohmann::json::parse(files::read_file(dir + "/" + run_dir::kCheckpointManifest));
  } catch (const std::exception& e) {
    *why = "no readable manifest.json (" + std::string(e.what()) + ")";
    return files;
  }
  try {
    if (m.at("magic") != kCheckpointMagic) {
      *why = "manifest.json: not a checkpoint manifest (bad magic)";
      return files;
    }
    if (m.at("version") != kCheckpointVersion) {
      *why = "checkpoint format version " + m.at("version").dump() + ", this build reads version " +
             std::to_string(kCheckpointVersion) + " (resume it with the build that wrote it, or set "
             "checkpoint.resume=none to start afresh)";
      if (other_version) *other_version = true;
      return files;
    }
    const ManifestHead h{m.at("step").get<int64_t>(), m.at("world_size").get<int64_t>()};
    const int64_t named = run_dir::parse_step_name(std::filesystem::path(dir).filename().string());
    if (named >= 0 && h.step != named) {
      *why = "manifest.json: step " + std::to_string(h.step) + " in a directory of step " + std::to_string(named);
      return files;
    }
    if (head) *head = h;
    for (auto& f : m.at("files")) {
      const std::string name = f.at("name").get<std::string>(), path = dir + "/" + name;
      std::error_code ec;
      auto size = std::filesystem::file_size(path, ec);
      if (ec) {
        *why = path + ": missing";
        return files;
      }
      if (size != f.at("bytes").get<uint64_t>()) {
        *why = path + ": size differs from manifest.json";
        return files;
      }
      files[name] = {size, f.at("xxh64").get<std::string>()};
    }
  } catch (const std::exception& e) {
    *why = "manifest.json: " + std::string(e.what());
  }
  return files;
}

// Reads files of one checkpoint, each checked against the manifest's checksum in the same pass.
class CheckedReader {
 public:
  CheckedReader(std::string dir, ManifestFiles files) : dir_(std::move(dir)), files_(std::move(files)) {}
  bool has(const std::string& name) const { return files_.count(name) > 0; }
  nlohmann::json json(const std::string& name) const {
    const std::string path = dir_ + "/" + name;
    std::string bytes;
    try {
      bytes = files::read_file(path);
    } catch (const DataError& e) {
      throw CheckpointError(e.what());
    }
    if (hex64(xxh64(bytes.data(), bytes.size())) != entry(name).second) throw CheckpointError(path + ": checksum mismatch");
    try {
      return nlohmann::json::parse(bytes);
    } catch (const std::exception& e) {
      throw CheckpointError(path + ": " + e.what());
    }
  }
  NamedTensors tensors(const std::string& name) const {
    return load_safetensors(dir_ + "/" + name, nullptr, entry(name).second);
  }
  // Checked now (check()), then read one tensor per call, each call's tensor alone in memory.
  std::vector<std::function<NamedTensors()>> tensor_by_tensor(const std::string& name) const {
    check(name);
    auto in = std::make_shared<SafetensorsReader>(dir_ + "/" + name);
    std::vector<std::function<NamedTensors()>> out;
    for (const auto& t : in->names()) out.push_back([in, t] { return NamedTensors{{t, in->read(t)}}; });
    return out;
  }
  // Throws CheckpointError unless the file is listed and its checksum matches (read, not kept).
  void check(const std::string& name) const {
    if (hex64(xxh64_file(dir_ + "/" + name)) != entry(name).second) throw CheckpointError(dir_ + "/" + name + ": checksum mismatch");
  }

 private:
  const std::pair<uint64_t, std::string>& entry(const std::string& name) const {
    auto it = files_.find(name);
    if (it == files_.end()) throw CheckpointError(dir_ + "/" + name + ": not listed in manifest.json");
    return it->second;
  }
  std::string dir_;
  ManifestFiles files_;
};

}  // namespace

CheckpointReader::CheckpointReader(const CheckpointConfig& cfg, const std::string& run_dir, int rank)
    : cfg_(cfg), ckpt_dir_(run_dir::checkpoints(run_dir)), quarantine_(run_dir::quarantine(run_dir)), rank_(rank) {}

std::string CheckpointReader::verify(const std::string& dir) {
  std::string why;
  for (auto& [name, f] : read_manifest(dir, &why)) {
    if (!why.empty()) break;
    if (hex64(xxh64_file(dir + "/" + name)) != f.second) return dir + "/" + name + ": checksum mismatch";
  }
  return why;
}

std::string CheckpointReader::load_resume(CheckpointState* out) {
  if (cfg_.resume_none()) return "";
  if (!cfg_.resume_auto()) {
    try {
      *out = load(cfg_.resume);
    } catch (const CheckpointError& e) {
      throw CheckpointError("checkpoint.resume=" + cfg_.resume + ": " + e.what());
    }
    return cfg_.resume;
  }
  // The newest that verifies; newer ones that do not are moved aside. When checkpoints exist and
  // none verifies, the run stops (a fresh start would silently lose it) unless checkpoint.force.
  std::vector<std::pair<std::string, std::string>> bad;  // directory, why
  for (auto& [step, dir] : run_dir::list_checkpoints(ckpt_dir_)) {
    std::string why;
    bool other_version = false;
    read_manifest(dir, &why, &other_version);
    if (other_version) throw CheckpointError(dir + ": " + why);
    try {
      *out = load(dir);
    } catch (const CheckpointError& e) {
      std::string what = e.what();  // without the directory, named once in front
      if (what.rfind(dir, 0) == 0) what.erase(0, what.find_first_not_of(":/ ", dir.size()));
      bad.emplace_back(dir, what);
      continue;
    }
    pending_quarantine_ = std::move(bad);
    return dir;
  }
  if (bad.empty()) return "";
  if (!cfg_.force) {
    std::string msg = std::to_string(bad.size()) + " checkpoint(s) and none verifies:";
    for (auto& [d, w] : bad) msg += " " + d + " (" + w + ");";
    throw CheckpointError(msg + " set checkpoint.resume=none to start afresh beside them, or checkpoint.force=true "
                          "to move them to " + quarantine_ + " and start afresh");
  }
  pending_quarantine_ = std::move(bad);
  log::warn("no checkpoint verifies: starting afresh (checkpoint.force)");
  return "";
}

CheckpointState CheckpointReader::load(const std::string& dir) {
  std::string why;
  ManifestHead head;
  CheckedReader in(dir, read_manifest(dir, &why, nullptr, &head));
  if (!why.empty()) throw CheckpointError(why);
  const auto state = in.json("state.json");
  if (state.value("magic", "") != kCheckpointMagic || state.value("version", 0) != kCheckpointVersion)
    throw CheckpointError(dir + "/state.json: not a version " + std::to_string(kCheckpointVersion) + " checkpoint");
  if (state.value("step", int64_t{-2}) != head.step || state.value("world_size", int64_t{-2}) != head.world_size)
    throw CheckpointError(dir + "/manifest.json: step or world_size differs from state.json's");
  CheckpointState st;
  try {
    st.step = state.at("step").get<int64_t>();
    st.run = state.at("run");
    for (auto& [key, values] : state.at("components").items()) st.replicated[key].values = values;
    // A whole component's file: checked now, read one tensor at a time when the component loads it
    // (so a rank keeping part of it, ZeRO-3's pieces of the weights or a sharded optimizer's ranges
    // of the moments, never holds it all, and no resume holds the file beside what it fills).
    for (auto& [key, file] : state.at("tensor_files").items()) st.replicated[key].shards = in.tensor_by_tensor(file.get<std::string>());
    // A sharded component's parts: checked now (a damaged one makes this checkpoint not verify),
    // read one at a time when the component loads them.
    if (state.contains("part_files"))
      for (auto& [key, files] : state.at("part_files").items()) {
        if (files.size() != static_cast<size_t>(head.world_size))
          throw CheckpointError(dir + "/state.json: " + std::to_string(files.size()) + " parts of '" + key + "' for " +
                                std::to_string(head.world_size) + " ranks");
        for (auto& file : files) {
          const std::string name = file.get<std::string>();
          in.check(name);
          st.replicated[key].shards.push_back([in, name] { return in.tensors(name); });
        }
      }
    // A rank the checkpoint did not have (the world grew) takes rank 0's file: its loader cursor is
    // global; an own-rank component (the RNG streams) gets none (StateRegistry::Scope::kOwnRank).
    const std::string mine = "rank_" + std::to_string(rank_) + ".json";
    const auto rank_state = in.json(in.has(mine) ? mine : "rank_0.json");
    st.saved_rank = rank_state.at("rank").get<int>();
    st.loaded_rank = rank_;
    for (auto& [key, values] : rank_state.at("components").items()) st.per_rank[key].values = values;
  } catch (const nlohmann::json::exception& e) {
    throw CheckpointError(dir + ": malformed state (" + std::string(e.what()) + ")");
  }
  if (std::filesystem::path(dir).lexically_normal() == std::filesystem::path(ckpt_dir_ + "/" + run_dir::step_name(st.step)).lexically_normal())
    mark_verified(st.step);
  return st;
}

std::string CheckpointReader::quarantine(const std::string& dir, const std::string& why) {
  files::make_dirs(quarantine_);
  const std::string name = std::filesystem::path(dir).filename().string();
  std::string to = quarantine_ + "/" + name;
  for (int n = 1; files::exists(to); ++n) to = quarantine_ + "/" + name + "." + std::to_string(n);
  if (auto err = files::try_rename(dir, to); !err.empty()) throw Error("cannot move a damaged checkpoint aside: " + err);
  files::fsync_dir(quarantine_);
  files::fsync_dir(ckpt_dir_);
  log::warn("checkpoint " + dir + " did not verify (" + why + "): moved to " + to + " (kept, never deleted)");
  return to;
}

void CheckpointReader::quarantine_pending() {
  for (auto& [d, w] : pending_quarantine_) quarantine(d, w);
  pending_quarantine_.clear();
}

void CheckpointReader::mark_verified(int64_t step) {
  std::lock_guard<std::mutex> lock(mu_);
  verified_.insert(step);
}

bool CheckpointReader::known_to_verify(int64_t step) const {
  std::lock_guard<std::mutex> lock(mu_);
  return verified_.count(step) > 0;
}

}  // namespace lm
