// The resume protocol (see resume.h).
#include "trainer/checkpoint/resume.h"

#include "common/build_info.h"
#include "common/errors.h"
#include "common/log.h"
#include "models/registry.h"
#include "trainer/comm/process_group.h"
#include "run/run_dir.h"

namespace lm {

ResumePoint find_resume(Checkpointer& ckpt, const CheckpointConfig& cfg, Comm* comm, int rank) {
  ResumePoint r;
  int64_t step = -1;
  if (rank == 0) {
    r.dir = ckpt.load_resume(&r.state);
    if (!r.dir.empty()) step = r.state.step;
  }
  if (comm) {
    auto t = torch::tensor({step}, torch::kLong);
    comm->broadcast(t, 0, "broadcast of the resume step");
    step = t.item<int64_t>();
    if (rank != 0 && step >= 0) {
      r.dir = !cfg.resume_auto() ? cfg.resume : ckpt.dir() + "/" + run_dir::step_name(step);
      r.state = ckpt.load(r.dir);
    }
  }
  return r;
}

nlohmann::json arch_json(const ModelConfig& m, int64_t vocab) {
  nlohmann::json j = {{"arch", m.arch}};
  for (const auto& [name, value] : shape_facts(m)) j[name] = value;
  j["vocab"] = vocab;
  return j;
}

nlohmann::json run_facts(const std::string& config_yaml, const ModelConfig& m, int64_t vocab,
                         const std::string& data_version) {
  return {{"config", config_yaml}, {"arch", arch_json(m, vocab)}, {"data_version", data_version},
          {"code", {{"commit", build_git_commit()}, {"dirty", build_git_dirty()}}}};
}

void check_compatible(const ResumePoint& r, const nlohmann::json& arch, const std::string& data_version, bool force) {
  auto mismatch = [&](const std::string& what, const nlohmann::json& theirs, const nlohmann::json& ours) {
    std::string msg = "checkpoint " + r.dir + " has " + what + " " + theirs.dump() + ", the config gives " + ours.dump();
    if (!force) throw CheckpointError(msg + " (set checkpoint.force=true to load it anyway)");
    log::warn(msg + ": loading anyway (checkpoint.force)");
  };
  const auto& run = r.state.run;
  if (run.at("arch") != arch) mismatch("model architecture", run.at("arch"), arch);
  if (!data_version.empty() && run.at("data_version") != data_version) mismatch("data version", run.at("data_version"), data_version);
}

}  // namespace lm
