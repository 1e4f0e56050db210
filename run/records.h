// The metric records: the one description of what metrics.jsonl (and TensorBoard) holds, their
// names and units. The trainer writes these keys; the metrics sink, report, sweep and the tests read
// them through these names. Torch-free, header-only.
//
// Every line of RUN_DIR/metrics.jsonl is one JSON object with "kind", "step" (optimizer steps done)
// and "time" (unix seconds). The kinds and their fields:
//   train       a logged window of log.every_steps steps: loss ... batch_hash (see kFields),
//               source_tokens, source_tokens_total (per source, below); z_loss with optim.z_loss > 0
//   val         val_loss (and val_loss_ema with train.ema_decay)
//   task        one per eval.tasks task at each evaluation (and at the start): task (its name),
//               task_acc, task_acc_norm, task_examples, task_truncated
//   checkpoint  dir, async, ckpt_block_ms, ckpt_write_ms, ckpt_mb, ckpt_mb_per_s, ckpt_steal_ms
//   resume      checkpoint, recovery_ms, load_ms
//   anomaly     reason, loss, grad_norm, action, batch_hash
//   window      window_s, steps_logged, tokens_per_s_{mean,min,max}, mfu_pct_{mean,min,max}
#pragma once

#include <cstddef>

namespace lm::records {

// Record kinds ("kind").
constexpr const char* kTrain = "train";
constexpr const char* kVal = "val";
constexpr const char* kTask = "task";
constexpr const char* kCheckpoint = "checkpoint";
constexpr const char* kResume = "resume";
constexpr const char* kAnomaly = "anomaly";
constexpr const char* kLongWindow = "window";

// Field names.
constexpr const char* kKind = "kind";
constexpr const char* kStep = "step";
constexpr const char* kTime = "time";
constexpr const char* kLoss = "loss";
constexpr const char* kLr = "lr";
constexpr const char* kGradNorm = "grad_norm";
constexpr const char* kZLoss = "z_loss";
constexpr const char* kTokensPerS = "tokens_per_s";
constexpr const char* kTokensPerSRank = "tokens_per_s_rank";
constexpr const char* kStepMs = "step_ms";
constexpr const char* kDataWaitMs = "data_wait_ms";
constexpr const char* kDataWaitPct = "data_wait_pct";
constexpr const char* kMemMb = "mem_mb";
constexpr const char* kTokens = "tokens";
constexpr const char* kEpoch = "epoch";
constexpr const char* kBatchHash = "batch_hash";
constexpr const char* kMfuPct = "mfu_pct";
constexpr const char* kPaddingPct = "padding_pct";
constexpr const char* kCpuStealPct = "cpu_steal_pct";
constexpr const char* kValLoss = "val_loss";
constexpr const char* kValLossEma = "val_loss_ema";
constexpr const char* kValData = "val_data";
constexpr const char* kValSplit = "val_split";
constexpr const char* kTaskName = "task";  // the task's name (eval.tasks[i].name)
constexpr const char* kTaskAcc = "task_acc";
constexpr const char* kTaskAccNorm = "task_acc_norm";
constexpr const char* kTaskExamples = "task_examples";
constexpr const char* kTaskTruncated = "task_truncated";
constexpr const char* kDir = "dir";
constexpr const char* kAsync = "async";
constexpr const char* kCkptBlockMs = "ckpt_block_ms";
constexpr const char* kCkptWriteMs = "ckpt_write_ms";
constexpr const char* kCkptMb = "ckpt_mb";
constexpr const char* kCkptMbPerS = "ckpt_mb_per_s";
constexpr const char* kCkptStealMs = "ckpt_steal_ms";
constexpr const char* kCheckpointDir = "checkpoint";
constexpr const char* kRecoveryMs = "recovery_ms";
constexpr const char* kLoadMs = "load_ms";
constexpr const char* kReason = "reason";
constexpr const char* kAction = "action";
constexpr const char* kWindowS = "window_s";
constexpr const char* kStepsLogged = "steps_logged";
constexpr const char* kTokensPerSMean = "tokens_per_s_mean";
constexpr const char* kTokensPerSMin = "tokens_per_s_min";
constexpr const char* kTokensPerSMax = "tokens_per_s_max";
constexpr const char* kMfuPctMean = "mfu_pct_mean";
constexpr const char* kMfuPctMin = "mfu_pct_min";
constexpr const char* kMfuPctMax = "mfu_pct_max";
// The realised data mixture, in "train" records: objects {source name: target tokens} of the
// window (kSourceTokens) and of the whole run (kSourceTokensTotal). TensorBoard: data/tokens/NAME,
// data/share/NAME (the run's realised share, %).
constexpr const char* kSourceTokens = "source_tokens";
constexpr const char* kSourceTokensTotal = "source_tokens_total";
// summary.json (written once at the end): steps, first_loss, last_loss, val_loss (null without validation), tokens_per_s,
// tasks ({name: {acc, acc_norm, first_acc, first_acc_norm, examples}} with eval.tasks), wall_s, world_size, telemetry_ms_per_step, telemetry_sink_cpu_ms_per_step, padding_pct (bucketed).
constexpr const char* kSteps = "steps";
constexpr const char* kFirstLoss = "first_loss";
constexpr const char* kLastLoss = "last_loss";
constexpr const char* kWallS = "wall_s";
constexpr const char* kTasks = "tasks";
constexpr const char* kAcc = "acc";
constexpr const char* kAccNorm = "acc_norm";
constexpr const char* kFirstAcc = "first_acc";
constexpr const char* kFirstAccNorm = "first_acc_norm";
constexpr const char* kExamples = "examples";
constexpr const char* kWorldSize = "world_size";
constexpr const char* kTelemetryMsPerStep = "telemetry_ms_per_step";  // training thread: building + enqueueing records
constexpr const char* kTelemetrySinkCpuMsPerStep = "telemetry_sink_cpu_ms_per_step";  // the sink thread's CPU time

// Name, unit and meaning of each numeric field a chart or table may show.
struct Field {
  const char* name;
  const char* kind;  // the record kind it appears in
  const char* unit;  // "" when dimensionless
  const char* what;
};
constexpr Field kFields[] = {
    {kLoss, kTrain, "nats/token", "mean training loss over the logged window; null when a step in it was non-finite"},
    {kZLoss, kTrain, "nats/token", "optim.z_loss > 0: mean z-loss term per target token over the window, z_loss x "
     "logsumexp(logits)^2, trained on beside the loss (not part of it); null when a step in it was non-finite"},
    {kLr, kTrain, "", "learning rate of the window's last step"},
    {kGradNorm, kTrain, "", "global gradient norm before clipping, last step of the window"},
    {kTokensPerS, kTrain, "tokens/s", "target tokens per second over all ranks (window wall time)"},
    {kTokensPerSRank, kTrain, "tokens/s", "tokens_per_s divided by the world size"},
    {kStepMs, kTrain, "ms", "mean wall time of one optimizer step (data, forward, backward, sync, update)"},
    {kDataWaitMs, kTrain, "ms", "mean time per step the training thread waited for batches (slowest rank)"},
    {kDataWaitPct, kTrain, "%", "data_wait_ms as a share of step time"},
    {kMemMb, kTrain, "MB", "CUDA peak allocated memory, or the process RSS on CPU"},
    {kTokens, kTrain, "tokens", "target tokens trained on so far"},
    {kEpoch, kTrain, "", "epoch of the loader's cursor"},
    {kMfuPct, kTrain, "%", "matmul FLOPs / step time against the peak the log names (CPU: measured SGEMM); null when unknown"},
    {kPaddingPct, kTrain, "%", "bucketed mode: padded share of the window's input positions"},
    {kCpuStealPct, kTrain, "%", "CPU time the hypervisor took from this machine's CPUs over the window (top's st); null when unknown"},
    {kValLoss, kVal, "nats/token", "mean validation loss over eval.batches micro-batches"},
    {kValLossEma, kVal, "nats/token", "validation loss of the EMA weights"},
    {kValData, kVal, "", "the dataset directory the validation loss was computed on"},
    {kValSplit, kVal, "", "its split: val, or train when the data has no val split (not a held-out loss)"},
    {kTaskAcc, kTask, "", "share of the task's examples whose choice of highest log-likelihood given the context is the "
     "label (TensorBoard: task/NAME/acc)"},
    {kTaskAccNorm, kTask, "", "the same with each choice's log-likelihood divided by its length in bytes, lm-eval's "
     "acc_norm (TensorBoard: task/NAME/acc_norm)"},
    {kTaskExamples, kTask, "", "the task's examples (all ranks)"},
    {kTaskTruncated, kTask, "", "examples with a context + choice cut from the left to model.seq_len"},
    {kCkptBlockMs, kCheckpoint, "ms", "real stall: the save call plus the in-flight steps' extra time"},
    {kCkptWriteMs, kCheckpoint, "ms", "time to write and commit the checkpoint"},
    {kCkptMb, kCheckpoint, "MB", "megabytes written by rank 0"},
    {kCkptMbPerS, kCheckpoint, "MB/s", "ckpt_mb / ckpt_write_ms"},
    {kCkptStealMs, kCheckpoint, "ms", "CPU time the hypervisor took from this machine's CPUs (all) while the save was in flight"},
    {kRecoveryMs, kResume, "ms", "process start to the end of the first resumed step"},
    {kLoadMs, kResume, "ms", "time to read and verify the checkpoint"},
};
constexpr size_t kNumFields = sizeof(kFields) / sizeof(kFields[0]);

// The field's description, or nullptr when `name` is not one.
inline const Field* find_field(const char* name) {
  for (const auto& f : kFields) {
    const char *a = f.name, *b = name;
    while (*a && *a == *b) ++a, ++b;
    if (*a == *b) return &f;
  }
  return nullptr;
}

}  // namespace lm::records
