// Validation loss (see evaluate.h).
#include "trainer/eval/evaluate.h"

#include <filesystem>
#include <vector>

#include "common/torch/compat.h"
#include "common/errors.h"
#include "common/log.h"
#include "data/remote/store.h"
#include "trainer/comm/process_group.h"

namespace lm {

std::unique_ptr<Evaluator> Evaluator::create(const EvalConfig& eval, const DataConfig& data,
                                             const data::Manifest& train, const EvalRuntime& rt) {
  if (eval.batches <= 0) return nullptr;
  const int rank = rt.rank;
  if (std::filesystem::is_regular_file(data.val))
    throw ConfigError("key 'data.val': " + data.val + " is a file; data.val takes a prep output directory or URL "
                      "(raw text validates on the val split of its own documents: leave data.val empty)");
  data::Manifest m = data.val.empty() ? train : data::open_dataset(data.val, "data.val", data::remote_options(data));
  if (m.tokenizer.kind != train.tokenizer.kind || m.tokenizer.hash != train.tokenizer.hash)
    throw ConfigError("key 'data.val': " + m.dir + " was tokenized with " + m.tokenizer.kind + " " + m.tokenizer.hash +
                      ", data.train (" + train.dir + ") with " + train.tokenizer.kind + " " + train.tokenizer.hash +
                      ": the losses would not be comparable");
  const std::string split = m.split_tokens("val") > 0 ? "val" : "train";
  if (split == "train" && rank == 0 && m.split_tokens(split) > static_cast<uint64_t>(rt.seq_len))
    log::warn("no 'val' split in " + m.dir + ": validation runs on its TRAIN split (val_split: train in the "
              "records; not a held-out loss). Prepare a val split or set data.val.");
  if (m.split_tokens(split) <= static_cast<uint64_t>(rt.seq_len)) {
    if (rank == 0) log::warn("no validation data in " + m.dir + ": validation disabled");
    return nullptr;
  }
  return std::unique_ptr<Evaluator>(new Evaluator(eval.batches, std::move(m), split, data.verify_full(), rt));
}

Evaluator::Evaluator(int64_t batches, data::Manifest m, const std::string& split, bool verify_full,
                     const EvalRuntime& rt)
    : batches_(batches), manifest_(std::move(m)), split_(split), rt_(rt) {
  reader_ = std::make_unique<data::ValReader>(manifest_, split, rt_.seq_len, verify_full);
}

double Evaluator::mean_loss(LM& model, Comm* comm) {
  torch::NoGradGuard ng;
  model->eval();
  reader_->reset();
  const int64_t B = rt_.batch_rows, T = rt_.seq_len;
  std::vector<int64_t> buf;
  double total = 0;
  const int64_t rounds = (batches_ + rt_.world - 1) / rt_.world * rt_.world;  // every rank as many (evaluate.h)
  for (int64_t i = 0; i < rounds; ++i) {
    if (i < batches_) reader_->next(B, buf);  // (B, T+1) windows: inputs w[:, :T], targets w[:, 1:]
    if (i % rt_.world != rt_.rank) continue;
    auto w = torch::from_blob(buf.data(), {B, T + 1}, torch::kLong).to(rt_.device, /*non_blocking=*/false, /*copy=*/true);
    if (rt_.bf16) compat::set_autocast(rt_.device, true);
    const double loss = model->loss(w.slice(1, 0, T), w.slice(1, 1, T + 1)).item<double>();
    if (i < batches_) total += loss;  // else a forward in step with the others only
    if (rt_.bf16) {
      compat::set_autocast(rt_.device, false);
      compat::clear_autocast_cache();
    }
  }
  model->train();
  if (comm) {
    auto t = torch::tensor({total}, torch::kDouble);
    comm->all_reduce_sum(t, "all-reduce of the validation loss");
    total = t.item<double>();
  }
  return total / batches_;
}

}  // namespace lm
