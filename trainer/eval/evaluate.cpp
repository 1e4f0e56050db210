// Validation loss (see evaluate.h).
#include "trainer/eval/evaluate.h"

#include <filesystem>
#include <vector>

#include "common/torch/compat.h"
#include "common/errors.h"
#include "common/log.h"
#include "data/remote/store.h"
#include "trainer/parallel/process_group.h"

namespace lm {

std::unique_ptr<Evaluator> Evaluator::create(const ExperimentConfig& cfg, const data::Manifest& train,
                                             const torch::Device& device, int rank, int world) {
  if (cfg.eval.batches <= 0) return nullptr;
  if (std::filesystem::is_regular_file(cfg.data.val))
    throw ConfigError("key 'data.val': " + cfg.data.val + " is a file; data.val takes a prep output directory or URL "
                      "(raw text validates on the val split of its own documents: leave data.val empty)");
  data::Manifest m = cfg.data.val.empty() ? train : data::open_dataset(cfg.data.val, "data.val", data::remote_options(cfg.data));
  if (m.tokenizer.kind != train.tokenizer.kind || m.tokenizer.hash != train.tokenizer.hash)
    throw ConfigError("key 'data.val': " + m.dir + " was tokenized with " + m.tokenizer.kind + " " + m.tokenizer.hash +
                      ", data.train (" + train.dir + ") with " + train.tokenizer.kind + " " + train.tokenizer.hash +
                      ": the losses would not be comparable");
  const std::string split = m.split_tokens("val") > 0 ? "val" : "train";
  if (split == "train" && rank == 0 && m.split_tokens(split) > static_cast<uint64_t>(cfg.model.seq_len))
    log::warn("no 'val' split in " + m.dir + ": validation runs on its TRAIN split (val_split: train in the "
              "records; not a held-out loss). Prepare a val split or set data.val.");
  if (m.split_tokens(split) <= static_cast<uint64_t>(cfg.model.seq_len)) {
    if (rank == 0) log::warn("no validation data in " + m.dir + ": validation disabled");
    return nullptr;
  }
  return std::unique_ptr<Evaluator>(new Evaluator(cfg, std::move(m), split, device, rank, world));
}

Evaluator::Evaluator(const ExperimentConfig& cfg, data::Manifest m, const std::string& split,
                     const torch::Device& device, int rank, int world)
    : cfg_(cfg), manifest_(std::move(m)), split_(split), device_(device), rank_(rank), world_(world),
      bf16_(cfg.train.bf16()) {
  reader_ = std::make_unique<data::ValReader>(manifest_, split, cfg.model.seq_len, cfg.data.verify_full());
}

double Evaluator::mean_loss(LM& model, Comm* comm) {
  torch::NoGradGuard ng;
  model->eval();
  reader_->reset();
  const int64_t B = cfg_.train.micro_batch_size, T = cfg_.model.seq_len;
  std::vector<int64_t> buf;
  double total = 0;
  for (int64_t i = 0; i < cfg_.eval.batches; ++i) {
    reader_->next(B, buf);  // (B, T+1) windows: inputs w[:, :T], targets w[:, 1:]
    if (i % world_ != rank_) continue;
    auto w = torch::from_blob(buf.data(), {B, T + 1}, torch::kLong).to(device_, /*non_blocking=*/false, /*copy=*/true);
    if (bf16_) compat::set_autocast(device_, true);
    total += model->loss(w.slice(1, 0, T), w.slice(1, 1, T + 1)).item<double>();
    if (bf16_) {
      compat::set_autocast(device_, false);
      compat::clear_autocast_cache();
    }
  }
  model->train();
  if (comm) {
    auto t = torch::tensor({total}, torch::kDouble);
    comm->all_reduce_sum(t, "all-reduce of the validation loss");
    total = t.item<double>();
  }
  return total / cfg_.eval.batches;
}

}  // namespace lm
