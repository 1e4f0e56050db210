// Writing checkpoints, sync and async: this rank's files, the commit (layout.h), retention, and
// the async save's staging, writer thread, pacing and stall measurement.
//
// Async saves stage the tensor files as images in one reusable host buffer (staging.h; pinned when
// the tensors live on a CUDA device) and a writer thread writes them from there (direct I/O where
// the file system takes it: common/files.h, try_write_plan).
// From CUDA the copy is made inside save(); from CPU memory it is made while the next step's
// forward and backward run, in chunks taken by the writer thread (idle priority for the copy and
// a yield between pieces, common/parallel.h; raised to normal priority by whoever waits for it,
// and for its writes, see writer.cpp, InFlight)
// and by wait_snapshot() (asked by the optimizer and the EMA before they write what it covers),
// which copies what is left and returns when all is copied. At most one save is in flight. The
// buffer is kept for the next save: host memory holds the state twice while async saves are on.
// (A forked writer, as Redis' BGSAVE, was measured against this design on the same training loop
// and stalled training longer: every page the next update writes is copied on write; see
// bench/ckpt_stall.sh and commit 223b6ab.)
//
// Pacing: the writer writes the staged images in pieces (8 MB writes, each after its checksum in
// 1 MB pieces, common/files.cpp) spread evenly over checkpoint.write_pace of the time until the
// next save is due (the interval in steps times the mean step time, known once due() has been
// asked; interval.h; common/parallel.h, Pacer: after its k-th MB of n the writer sleeps until k/n
// of that time has passed), instead of as fast as the disk takes them: on a VM the host's side of
// each disk write takes CPU from training. Writes slower than the pace are not slowed further.
// The copy into the staging buffer is never paced (the next update waits for it). Nothing else
// changes: the same files in the same order, fsync'd, then the manifest, then the rename; wait(),
// the destructor and a save() while one is in flight end the pacing and let the writer finish at
// full speed (and normal priority) (so a save due before the previous one finished behaves as without pacing). No
// interval known (every_steps 0, or no step seen), or write_pace 0: unpaced.
//
// SaveReport::block_ms is the real stall (trainer/checkpoint/stall.h): the time save() blocked
// plus, for an async save, the extra time of the steps that ran while it was in flight over steps
// that ran without one. It is final once the loop has reported the step during which the writer
// finished (step_done), and it is the cost checkpoint.every_steps: auto uses (the writer records
// it in the interval policy).
//
// After a commit, retention (checkpoint.keep_last, keep_every) deletes only checkpoints known to
// verify (reader.h); one that does not is moved to the quarantine. A re-save of an existing step
// keeps the old directory until the new one is committed (step_N.old; put back by the next writer
// after a crash, layout.h).
//
// Fault injection for tests: LM_FAULT_KILL_IN_SAVE=<step> SIGKILLs the trainer after the first
// file of that step's checkpoint is written.
//
// Not thread-safe: the training thread calls it (its own writer thread is internal).
#pragma once

#include <torch/torch.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/files.h"
#include "common/torch/stateful.h"
#include "run/config/checkpoint_config.h"
#include "trainer/checkpoint/interval.h"
#include "trainer/checkpoint/reader.h"
#include "trainer/checkpoint/stall.h"
#include "trainer/checkpoint/staging.h"
#include "trainer/checkpoint/state.h"

namespace lm {

struct SaveReport {
  int64_t step = 0;
  std::string dir;
  bool async = false;
  double block_ms = 0;   // the real stall: save() plus the in-flight steps' extra time (see above)
  double call_ms = 0;    // the save() call alone
  double write_ms = 0;   // time to write and commit the files
  double mb = 0;         // megabytes written by this rank
  double steal_ms = 0;   // CPU time the hypervisor took from this machine's CPUs meanwhile (clock.h)
  double pace_ms = 0;    // async: the time its writes were to be spread over (0: unpaced; see Pacing)
  double slept_ms = 0;   // async: the time the writer slept to keep that pace
  std::string error;     // empty when it succeeded
};

class CheckpointWriter : public WriteFence {
 public:
  // Creates (and fsyncs) RUN_DIR/checkpoints; on rank 0 removes stale "*.tmp" directories of
  // interrupted saves, finishes interrupted removals and repairs an interrupted re-save.
  // reader: what retention asks (known to verify, quarantine); policy: told each save's step,
  // size and measured cost, asked for the interval the writes are paced over. Both must outlive it.
  CheckpointWriter(const CheckpointConfig& cfg, const std::string& run_dir, int rank, int world_size,
                   CheckpointReader& reader, SaveInterval& policy);
  ~CheckpointWriter();  // waits for an in-flight save
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  // Saves `st`. Sync: returns once committed (rank 0) or once this rank's files are written.
  // Async: returns once the snapshot is taken. Failures are reported through finished() (and
  // thrown here when synchronous and on_error is stop).
  void save(const CheckpointState& st);
  // Async saves (rank 0): the staging buffer for a state like `st`, allocated now and its pages
  // faulted in on a background thread, so that the first save's steps do not pay for them.
  void prepare(const CheckpointState& st);
  // Reports of saves finished (and their stall measured) since the last call, oldest first.
  std::vector<SaveReport> finished();
  // finished(), oldest first: each save that succeeded goes to `saved`; a failure, like
  // `other_error` (another background writer's, e.g. the metrics sink's; "" for none), ends the run
  // where checkpoint.on_error is stop (throws Error: one line, exit 1) and is warned about where it
  // is continue.
  void report(const std::string& other_error, const std::function<void(const SaveReport&)>& saved);
  void wait();  // until no save is in flight
  // REQUIRES: called before anything the last snapshot holds is updated (parameters, optimizer
  // moments, EMA). Returns once the async save's staging copy is complete. The optimizer and the
  // EMA ask it themselves, through before_write() (AdamW/Ema::set_fence).
  void wait_snapshot();
  void before_write() override { wait_snapshot(); }
  // The loop finished a step of step_s seconds (its whole time, wait_snapshot included).
  void step_done(double step_s);
  // Pacing (see above): the time the next async save's writes are spread over, in seconds (0:
  // unpaced).
  double pace_target_s() const;

 private:
  struct InFlight;
  std::vector<files::FilePlan> plan_files(const CheckpointState& st, std::vector<torch::Tensor>* keep, InFlight* f);
  void close_inflight(double extra_s);  // the in-flight save is over: its stall measured, its report recorded
  void record(SaveReport r);
  void prune();

  CheckpointConfig cfg_;
  std::string ckpt_dir_;
  int rank_, world_;
  CheckpointReader& reader_;
  SaveInterval& policy_;
  std::unique_ptr<InFlight> inflight_;
  std::vector<SaveReport> done_;
  StagingBuffer staging_;  // the async saves' snapshot, kept between saves
  StallMeter stall_;
};

}  // namespace lm
