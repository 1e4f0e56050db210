// Full-state checkpoints: layout, atomic commit, verification, retention, sync and async saves.
//
// RUN_DIR/checkpoints/step_<8-digit step>/   (names from run/run_dir.h)
//   <key>.safetensors  tensors of each replicated component (model, optimizer, ema)     rank 0
//   <key>.part_<r>.safetensors  rank r's part of a sharded component (sharded optimizer, ZeRO-3's weights and EMA)  every rank
//   state.json         magic, version, step, run facts, replicated components' values  rank 0
//   rank_<r>.json      that rank's components (loader state, RNG streams)               every rank
//   manifest.json      magic, version, every file with bytes and xxh64                  rank 0, LAST
// What goes into the files is composed by component (trainer/checkpoint/state.h).
// Files are written into "step_<N>.tmp", fsync'd; rank 0 waits until every rank has finished its
// files (rank_<r>.done markers on the shared file system, each renamed into place whole), writes manifest.json, renames the
// directory into place and fsyncs the parent. A directory without a verifying manifest is never a
// checkpoint.
//
// A sharded component's parts are listed in state.json ("part_files"); load() checks every part's
// checksum and hands them to the component to read one at a time, at any world size (state.h).
//
// Async saves stage the tensor files as images in one reusable host buffer (staging.h; pinned when
// the tensors live on a CUDA device) and a writer thread writes them from there (direct I/O where
// the file system takes it: common/files.h, try_write_plan).
// From CUDA the copy is made inside save(); from CPU memory it is made while the next step's
// forward and backward run, in chunks taken by the writer thread (idle priority for the copy and
// a yield between pieces, common/parallel.h; raised to normal priority by whoever waits for it,
// and for its writes, see checkpoint.cpp, InFlight)
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
// asked; common/parallel.h, Pacer: after its k-th MB of n the writer sleeps until k/n of that
// time has passed), instead of as fast as the disk takes them: on a VM the host's side of each
// disk write takes CPU from training. Writes slower than the pace are not slowed further.
// The copy into the staging buffer is never paced (the next update waits for it). Nothing else
// changes: the same files in the same order, fsync'd, then the manifest, then the rename; wait(),
// the destructor and a save() while one is in flight end the pacing and let the writer finish at
// full speed (and normal priority) (so a save due before the previous one finished behaves as without pacing). No
// interval known (every_steps 0, or no step seen), or write_pace 0: unpaced.
//
// SaveReport::block_ms is the real stall (trainer/checkpoint/stall.h): the time save() blocked
// plus, for an async save, the extra time of the steps that ran while it was in flight over steps
// that ran without one. It is final once the loop has reported the step during which the writer
// finished (step_done), and it is the cost checkpoint.every_steps: auto uses.
//
// Damaged checkpoints: resume: auto takes the newest that verifies and moves newer ones that do not
// into checkpoints/quarantine/ (run_dir::quarantine); when checkpoints exist and none verifies it
// refuses (CheckpointError naming each and why) unless checkpoint.force (then all are moved aside
// and the run starts afresh). Retention deletes only checkpoints known to verify; one that does not
// is moved aside too. A re-save of an existing step keeps the old directory until the new one is
// committed (step_N.old; put back by the next Checkpointer after a crash).
//
// A checkpoint of another format version is refused with CheckpointError (exit 2), also by
// resume: auto, naming the directory and both versions.
//
// Fault injection for tests: LM_FAULT_KILL_IN_SAVE=<step> SIGKILLs the trainer after the first
// file of that step's checkpoint is written.
#pragma once

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "run/config/checkpoint_config.h"
#include "trainer/checkpoint/interval.h"
#include "trainer/checkpoint/stall.h"
#include "trainer/checkpoint/staging.h"
#include "trainer/checkpoint/state.h"

namespace lm {

constexpr const char* kCheckpointMagic = "LMTRAIN-CHECKPOINT";
// 2: components under fixed keys (state.h). 1: fixed model/optimizer/ema files (refused).
constexpr int kCheckpointVersion = 2;

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

class Checkpointer : public WriteFence {
 public:
  // Creates (and fsyncs) RUN_DIR/checkpoints; on rank 0 removes stale "*.tmp" directories of
  // interrupted saves and repairs an interrupted re-save. nodes: machines in the job
  // (checkpoint.mtbf_hours is per node; see interval.h).
  Checkpointer(const CheckpointConfig& cfg, const std::string& run_dir, int rank, int world_size, int nodes = 1);
  ~Checkpointer();  // waits for an in-flight save
  Checkpointer(const Checkpointer&) = delete;
  Checkpointer& operator=(const Checkpointer&) = delete;

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

  // Whether a save is due after `step` optimizer steps. step_s: this step's measured seconds, whose
  // running mean every_steps: auto weighs the save's cost against (interval.h).
  bool due(int64_t step, double step_s) {
    mean_step_s_ = mean_step_s_ == 0 ? step_s : 0.9 * mean_step_s_ + 0.1 * step_s;
    return interval_.due(step, last_save_step_, mean_step_s_);
  }

  // Loads the checkpoint to resume from per cfg.resume into *out and returns its directory, or ""
  // for a fresh start. "auto": the newest directory under RUN_DIR/checkpoints whose manifest and
  // checksums verify; newer ones that do not are to be moved to the quarantine (by
  // quarantine_pending(), once the run is known to start: a refused start moves nothing); none
  // verifies: CheckpointError (see above). An explicit path that does not verify throws
  // CheckpointError.
  std::string load_resume(CheckpointState* out);
  // Moves the checkpoints load_resume found damaged into the quarantine, a warning naming each and
  // why. The first save() calls it, if nothing did before.
  void quarantine_pending();
  // Reads a checkpoint for this rank, checking every file it reads against manifest.json's size
  // and xxh64 in the same pass; a rank the checkpoint has no file for gets rank 0's. Counts it as
  // the last save. Throws CheckpointError naming the file.
  CheckpointState load(const std::string& dir);
  // Pacing (see above): the time the next async save's writes are spread over, in seconds (0:
  // unpaced).
  double pace_target_s() const;
  // Step of the last save started (or loaded).
  int64_t last_save_step() const { return last_save_step_; }

  // "" when dir is a complete checkpoint whose files all match manifest.json, else why not
  // (reads every file).
  static std::string verify(const std::string& dir);
  const std::string& dir() const { return ckpt_dir_; }

 private:
  struct InFlight;
  std::vector<files::FilePlan> plan_files(const CheckpointState& st, std::vector<torch::Tensor>* keep, InFlight* f);
  void close_inflight(double extra_s);  // the in-flight save is over: its stall measured, its report recorded
  void record(SaveReport r);
  void prune();
  // Moves a checkpoint that did not verify into the quarantine (a free name there) and logs where.
  std::string quarantine(const std::string& dir, const std::string& why);

  CheckpointConfig cfg_;
  std::string ckpt_dir_, quarantine_;
  int rank_, world_;
  std::unique_ptr<InFlight> inflight_;
  std::vector<SaveReport> done_;
  StagingBuffer staging_;  // the async saves' snapshot, kept between saves
  StallMeter stall_;
  std::mutex mu_;
  std::vector<std::pair<std::string, std::string>> pending_quarantine_;  // load_resume's: directory, why
  std::set<int64_t> verified_;  // steps known to verify: committed or loaded here (guarded by mu_)
  SaveInterval interval_;
  int64_t last_save_step_ = 0;
  double mean_step_s_ = 0;  // due()'s running mean
};

}  // namespace lm
