// Reading checkpoints: verification, loading, the resume point and the quarantine of damaged
// checkpoints. The files and how they are committed are in layout.h.
//
// A load checks every file it reads against manifest.json's size and xxh64 in the same pass. A
// sharded component's parts (state.json's "part_files") each have their checksum checked, then
// are handed to the component to read one at a time, at any world size (state.h); a whole
// component's file is checked, then read one tensor at a time as the component takes it.
//
// Damaged checkpoints: resume: auto takes the newest that verifies and moves newer ones that do not
// into checkpoints/quarantine/ (run_dir::quarantine); when checkpoints exist and none verifies it
// refuses (CheckpointError naming each and why) unless checkpoint.force (then all are moved aside
// and the run starts afresh). Retention (writer.h) moves one that does not verify aside too, through
// quarantine().
//
// A checkpoint of another format version is refused with CheckpointError (exit 2), also by
// resume: auto, naming the directory and both versions.
//
// Not thread-safe but for the steps known to verify (mark_verified, known_to_verify): the training
// thread calls it.
#pragma once

#include <cstdint>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "run/config/checkpoint_config.h"
#include "trainer/checkpoint/state.h"

namespace lm {

class CheckpointReader {
 public:
  // Touches no file: the writer (writer.h) creates and tidies RUN_DIR/checkpoints.
  CheckpointReader(const CheckpointConfig& cfg, const std::string& run_dir, int rank);
  CheckpointReader(const CheckpointReader&) = delete;
  CheckpointReader& operator=(const CheckpointReader&) = delete;

  // "" when dir is a complete checkpoint whose files all match manifest.json, else why not
  // (reads every file).
  static std::string verify(const std::string& dir);

  // Loads the checkpoint to resume from per cfg.resume into *out and returns its directory, or ""
  // for a fresh start. "auto": the newest directory under RUN_DIR/checkpoints whose manifest and
  // checksums verify; newer ones that do not are to be moved to the quarantine (by
  // quarantine_pending(), once the run is known to start: a refused start moves nothing); none
  // verifies: CheckpointError (see above). An explicit path that does not verify throws
  // CheckpointError.
  std::string load_resume(CheckpointState* out);
  // Reads a checkpoint for this rank, checking every file it reads against manifest.json's size
  // and xxh64 in the same pass; a rank the checkpoint has no file for gets rank 0's. A checkpoint
  // of this run's directory counts as known to verify. Throws CheckpointError naming the file.
  CheckpointState load(const std::string& dir);

  // Moves the checkpoints load_resume found damaged into the quarantine, a warning naming each and
  // why.
  void quarantine_pending();
  // Moves a checkpoint that did not verify into the quarantine (a free name there) and logs where;
  // returns its new path. Throws Error when it cannot be moved.
  std::string quarantine(const std::string& dir, const std::string& why);

  // The steps known to verify (committed by this process's writer, or loaded here): retention
  // deletes those without reading them again. Thread-safe.
  void mark_verified(int64_t step);
  bool known_to_verify(int64_t step) const;

  const std::string& dir() const { return ckpt_dir_; }

 private:
  CheckpointConfig cfg_;
  std::string ckpt_dir_, quarantine_;
  int rank_;
  std::vector<std::pair<std::string, std::string>> pending_quarantine_;  // load_resume's: directory, why
  mutable std::mutex mu_;
  std::set<int64_t> verified_;  // steps known to verify (guarded by mu_)
};

}  // namespace lm
