// The resume protocol: rank 0 picks the checkpoint (checkpoint.resume: auto = the newest that
// verifies), every rank loads the same one, and a checkpoint of another architecture or other data
// is refused (CheckpointError, exit 2) unless checkpoint.force.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>

#include "models/model_config.h"
#include "trainer/checkpoint/checkpoint.h"

namespace lm {

class Comm;

struct ResumePoint {
  std::string dir;        // "" = a fresh start
  CheckpointState state;  // what was loaded, when dir is set
};

// Collective when comm is set: every rank calls it.
ResumePoint find_resume(Checkpointer& ckpt, const CheckpointConfig& cfg, Comm* comm, int rank);

// The facts a checkpoint must match ("run" of its state): the architecture (vocab is the padded one).
nlohmann::json arch_json(const ModelConfig& m, int64_t vocab);

// The run facts a checkpoint carries ("run" of its state; check_compatible reads them back): the
// config, the architecture (arch_json), the data version and the code's commit.
nlohmann::json run_facts(const std::string& config_yaml, const ModelConfig& m, int64_t vocab,
                         const std::string& data_version);

// Throws CheckpointError naming the checkpoint and what differs, unless `force` (then warns). An
// empty data_version is not compared (a mixture, whose loader state checks each source).
void check_compatible(const ResumePoint& r, const nlohmann::json& arch, const std::string& data_version, bool force);

}  // namespace lm
