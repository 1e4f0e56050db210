// One process per directory: an exclusive lock on a lock file inside it, held for the life of the
// owner (trainer: RUN_DIR/run.lock, launch: LOG_DIR/<run_id>/launch_node<k>.lock, sweep:
// DIR/sweep.lock).
//
// A POSIX record lock (fcntl F_SETLK) on the whole file: the kernel releases it when the holder
// exits, however it dies, and it is never inherited by fork(), so a spawned worker (launch, sweep)
// never keeps a directory locked after its owner is gone. The holder's pid is also
// written into the file, for the message. Not thread-safe; one DirLock per file per process.
#pragma once

#include <string>

namespace lm {

class DirLock {
 public:
  // Creates `dir/name` when missing and locks it. Throws UsageError (exit 2) when another
  // process holds it: "<dir> is in use by <who> (pid N); ...", and lm::Error when the lock file
  // cannot be opened. `who` names the holder's kind ("another trainer", "another sweep").
  DirLock(const std::string& dir, const std::string& name, const std::string& who);
  ~DirLock();  // releases the lock (closes the file)
  DirLock(const DirLock&) = delete;
  DirLock& operator=(const DirLock&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int fd_ = -1;
};

}  // namespace lm
