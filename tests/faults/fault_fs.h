// A files::FileSystem for the fault matrix (tests/faults/README.md): the POSIX calls with one
// seeded fault, counting and journalling. Test-only: linked into build/bin/fault_trainer, never
// into the production binaries (they keep the plain POSIX file system; nothing reads an
// environment variable).
//
// Faults (one per process, FaultSpec):
//   enospc@N        the Nth write() and every write after it fail with ENOSPC (the disk is full)
//   eio@N           the Nth write() fails with EIO (once)
//   fsync_eio@N     the Nth fsync of a file fails with EIO (once)
//   kill_rename@N   SIGKILL just before the Nth rename
//   kill_renamed@N  SIGKILL just after the Nth rename, before its directory is fsync'd
//   kill_writer@N   SIGKILL at the Nth call made by the asynchronous checkpoint writer (a thread
//                   other than the one that installed this file system); once
//                   per run (a marker file next to the journal)
//   kill_part@N     SIGKILL at the Nth write() into a sharded component's part file (a rank's
//                   <key>.part_<r>.safetensors: the ZeRO-1 optimizer); once per run (the marker)
//   powercut@N      at the Nth call of any kind: every byte not fsync'd is dropped (files truncated
//                   to their last fsync'd size, files created or renamed in a directory not
//                   fsync'd since are removed or renamed back), then SIGKILL: a power cut
// Counting: how many calls of each kind the process made (part_writes: writes into part files) (a reference run's counts are the range
// the matrix draws N from). Journal (one line per event, appended by every process of the run):
//   start pid=P rank=R run_id=ID restart=K   a process began (fault_trainer; launcher env or "-")
//   durable <dir>                            a rename of a checkpoint directory (checkpoints/step_*)
//                                            became durable (its parent directory fsync'd after
//                                            it): a fault must never lose it
//   injected KIND@N pid=P call=C OP PATH     the fault fired, written at the moment it does (before
//                                            the SIGKILL, or as the failing call returns): the
//                                            matrix counts a fault as injected only with this line
#pragma once

#include <atomic>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "common/files.h"

namespace lm::faults {

struct FaultSpec {
  std::string kind;  // "" (none), enospc, eio, fsync_eio, kill_rename, kill_renamed, kill_writer, kill_part, powercut
  long n = 0;        // 1-based index of the call that faults
  // Parses "KIND@N"; throws UsageError.
  static FaultSpec parse(const std::string& text);
};

class FaultFileSystem : public files::FileSystem {
 public:
  FaultFileSystem(FaultSpec spec, std::string journal_path);
  int open_for_write(const char* path, int* fd) override;
  int write(int fd, const void* data, size_t n, size_t* written) override;
  int sync(int fd) override;
  int close(int fd) override;
  int rename(const char* from, const char* to) override;
  int sync_dir(const char* dir) override;
  int remove(const char* path) override;

  // "calls=N writes=N syncs=N renames=N sync_dirs=N part_writes=N" so far.
  std::string counts() const;
  // Whether this call comes from the async writer (another process or thread than the creator's).
  bool in_writer() const;
  // Appends a line to the journal (no-op without one).
  void journal(const std::string& line) const;

 private:
  bool tracking() const { return spec_.kind == "powercut"; }
  // Counts a call (op and path name it in an injection record); powercut@N and kill_writer@N fire here.
  void tick(const char* op, const char* path, int fd = -1);
  void power_cut();
  // The journal's "injected" line for the call being made.
  void injected(const char* op, const std::string& path) const;
  std::string path_of(int fd);  // the path an fd was opened with ("fd N" if unknown)

  // For powercut: what a crash would lose.
  struct OpenFile {
    std::string path;
    long long synced = 0;  // size at the last fsync
  };
  struct Rename {
    std::string from, to, stash;  // stash: the old `to`, hard-linked aside ("" if none)
  };
  FaultSpec spec_;
  std::string journal_;
  std::atomic<long> calls_{0}, writes_{0}, syncs_{0}, renames_{0}, sync_dirs_{0}, writer_calls_{0}, part_writes_{0};
  int pid_ = 0, tid_ = 0;  // the creator
  std::mutex mu_;                       // guards the maps below
  std::map<int, OpenFile> open_;        // fd -> file (every run: injection records name the path)
  std::vector<std::string> pending_ckpt_;  // checkpoint dirs renamed into place, not yet durable
  // The rest: powercut runs only.
  std::map<std::string, long long> unsynced_;  // closed files with unsynced bytes -> synced size
  std::vector<std::string> created_;    // files created in a directory not fsync'd since
  std::vector<Rename> renamed_;         // renames in a directory not fsync'd since
};

}  // namespace lm::faults
