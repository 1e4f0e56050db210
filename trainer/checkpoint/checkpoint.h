// Full-state checkpoints, as the training loop uses them: a thin composition of the three parts,
// each with its own header and contract.
//   layout.h    the directory and its files, the format version, the atomic commit (shared)
//   writer.h    CheckpointWriter: sync and async saves (staging, writer thread, pacing), the stall
//               measurement, retention, the re-save's step_N.old, the WriteFence answer
//   reader.h    CheckpointReader: verification, loading, the resume point, the quarantine
//   interval.h  SaveInterval: when a save is due (every N steps or Young/Daly from the measured
//               stall), the step of the last save and the mean step time
// Checkpointer owns one of each and forwards; what it adds: a load counts as the last save (for
// due() and last_save_step()), and the first save moves resume's damaged checkpoints aside if
// nothing did before.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/torch/stateful.h"
#include "run/config/checkpoint_config.h"
#include "trainer/checkpoint/interval.h"
#include "trainer/checkpoint/layout.h"
#include "trainer/checkpoint/reader.h"
#include "trainer/checkpoint/state.h"
#include "trainer/checkpoint/writer.h"

namespace lm {

class Checkpointer : public WriteFence {
 public:
  // Creates (and fsyncs) RUN_DIR/checkpoints; on rank 0 tidies what interrupted saves left
  // (writer.h). nodes: machines in the job (checkpoint.mtbf_hours is per node; see interval.h).
  Checkpointer(const CheckpointConfig& cfg, const std::string& run_dir, int rank, int world_size, int nodes = 1)
      : reader_(cfg, run_dir, rank), interval_(cfg, rank == 0, nodes), writer_(cfg, run_dir, rank, world_size, reader_, interval_) {}
  // (the writer, destroyed first, waits for an in-flight save)
  Checkpointer(const Checkpointer&) = delete;
  Checkpointer& operator=(const Checkpointer&) = delete;

  // CheckpointWriter::save, after quarantine_pending() (the trainer moves them once its start is
  // accepted, before any save).
  void save(const CheckpointState& st) {
    reader_.quarantine_pending();
    writer_.save(st);
  }
  void prepare(const CheckpointState& st) { writer_.prepare(st); }
  std::vector<SaveReport> finished() { return writer_.finished(); }
  void report(const std::string& other_error, const std::function<void(const SaveReport&)>& saved) {
    writer_.report(other_error, saved);
  }
  void wait() { writer_.wait(); }
  void wait_snapshot() { writer_.wait_snapshot(); }
  void before_write() override { writer_.wait_snapshot(); }
  void step_done(double step_s) { writer_.step_done(step_s); }
  double pace_target_s() const { return writer_.pace_target_s(); }

  // SaveInterval::due: whether a save is due after `step` optimizer steps, step_s this step's
  // measured seconds.
  bool due(int64_t step, double step_s) { return interval_.due(step, step_s); }
  // Step of the last save started (or loaded).
  int64_t last_save_step() const { return interval_.last_save_step(); }

  // CheckpointReader::load_resume and ::load; what they load counts as the last save.
  std::string load_resume(CheckpointState* out) {
    std::string dir = reader_.load_resume(out);
    if (!dir.empty()) interval_.saved(out->step);
    return dir;
  }
  CheckpointState load(const std::string& dir) {
    CheckpointState st = reader_.load(dir);
    interval_.saved(st.step);
    return st;
  }
  // Moves the checkpoints load_resume found damaged into the quarantine (CheckpointReader). The
  // first save() calls it, if nothing did before.
  void quarantine_pending() { reader_.quarantine_pending(); }
  const std::string& dir() const { return reader_.dir(); }

 private:
  // In this order: the writer refers to the other two, and its destructor still records the
  // in-flight save in them.
  CheckpointReader reader_;
  SaveInterval interval_;
  CheckpointWriter writer_;
};

}  // namespace lm
