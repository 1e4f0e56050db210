// Configuration of the run (`run:`) and the training loop (`train:`). Torch-free.
// The keys' descriptions and allowed values are in describe_run and describe_train
// (train_config.cpp); `trainer --keys` prints them with the defaults below.
#pragma once

#include <cstdint>
#include <string>

namespace lm {
namespace config_schema {
class Schema;
}

struct RunConfig {
  std::string dir = "runs/default";
  int64_t seed = 1337;
  bool skip_memory_check = false;
};

struct TrainConfig {
  int64_t max_steps = 1000;
  int64_t micro_batch_size = 8;
  int64_t grad_accum = 1;
  int64_t threads = 0;
  std::string device = "auto";
  double ema_decay = 0.0;
  std::string dtype = "fp32";
  std::string fused_loss = "auto";
  bool bf16_residual = false;
  std::string activation_checkpointing = "none";
  bool bf16() const { return dtype == "bf16"; }  // the one comparison of the choice
  // The one resolution of train.fused_loss: auto = on CUDA.
  bool fused_loss_on(bool cuda) const { return fused_loss == "on" || (fused_loss == "auto" && cuda); }
  bool recompute_blocks() const { return activation_checkpointing == "block"; }  // the one comparison
};

// The run.* and train.* keys into the config schema (config.cpp's describe()).
void describe_run(config_schema::Schema& s, RunConfig& r);
void describe_train(config_schema::Schema& s, TrainConfig& t);

}  // namespace lm
