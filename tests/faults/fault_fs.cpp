// The fault matrix's file system (see fault_fs.h).
#include "tests/faults/fault_fs.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "common/errors.h"

namespace lm::faults {
namespace {

namespace stdfs = std::filesystem;

std::string norm(const char* p) { return stdfs::absolute(p).lexically_normal().string(); }
std::string parent(const std::string& p) { return stdfs::path(p).parent_path().string(); }
bool under(const std::string& path, const std::string& dir) {
  return path.size() > dir.size() && path.compare(0, dir.size(), dir) == 0 && path[dir.size()] == '/';
}
long long file_size(int fd) {
  struct stat st {};
  return ::fstat(fd, &st) == 0 ? static_cast<long long>(st.st_size) : 0;
}
bool is_checkpoint_dir(const std::string& p) {
  const auto name = stdfs::path(p).filename().string();
  return name.rfind("step_", 0) == 0 && name.find('.') == std::string::npos &&
         stdfs::path(p).parent_path().filename() == "checkpoints";
}

}  // namespace

FaultSpec FaultSpec::parse(const std::string& text) {
  static const char* kinds[] = {"enospc", "eio", "fsync_eio", "kill_rename", "kill_renamed", "kill_writer", "kill_part",
                                "powercut"};
  const auto at = text.find('@');
  FaultSpec s;
  s.kind = text.substr(0, at);
  bool known = false;
  for (const char* k : kinds) known |= s.kind == k;
  char* end = nullptr;
  if (at != std::string::npos) s.n = std::strtol(text.c_str() + at + 1, &end, 10);
  if (!known || at == std::string::npos || *end != '\0' || s.n < 1)
    throw UsageError("--fault: expected KIND@N with N >= 1 and KIND one of enospc, eio, fsync_eio, "
                     "kill_rename, kill_renamed, kill_writer, kill_part, powercut; got '" + text + "'");
  return s;
}

FaultFileSystem::FaultFileSystem(FaultSpec spec, std::string journal_path)
    : spec_(std::move(spec)), journal_(std::move(journal_path)), pid_(::getpid()), tid_(::gettid()) {}

bool FaultFileSystem::in_writer() const { return ::getpid() != pid_ || ::gettid() != tid_; }

void FaultFileSystem::tick(const char* op, const char* path, int fd) {
  const long n = ++calls_;
  auto where = [&] { return path ? norm(path) : path_of(fd); };
  if (spec_.kind == "powercut" && n == spec_.n) {
    injected(op, where());
    power_cut();
  }
  if (spec_.kind == "kill_writer" && in_writer() && ++writer_calls_ == spec_.n) {
    // Once per run: the first writer to get here claims the marker (O_EXCL), then dies.
    int mfd = ::open((journal_ + ".fired").c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (mfd >= 0) {
      ::close(mfd);
      injected(op, where());
      ::raise(SIGKILL);
    }
  }
}

void FaultFileSystem::injected(const char* op, const std::string& path) const {
  journal("injected " + spec_.kind + "@" + std::to_string(spec_.n) + " pid=" + std::to_string(::getpid()) +
          " call=" + std::to_string(calls_.load()) + " " + op + " " + path);
}

std::string FaultFileSystem::path_of(int fd) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = open_.find(fd);
  return it != open_.end() ? it->second.path : "fd " + std::to_string(fd);
}

int FaultFileSystem::open_for_write(const char* path, int* fd) {
  tick("open", path);
  int e = FileSystem::open_for_write(path, fd);
  if (e == 0) {
    std::lock_guard<std::mutex> lock(mu_);
    open_[*fd] = {norm(path), 0};
    if (tracking()) created_.push_back(norm(path));
  }
  return e;
}

int FaultFileSystem::write(int fd, const void* data, size_t n, size_t* written) {
  tick("write", nullptr, fd);
  const long w = ++writes_;
  if (const std::string path = path_of(fd); path.find(".part_") != std::string::npos) {
    // A write into a rank's part of a sharded checkpoint component (layout.h: <key>.part_<r>).
    if (spec_.kind == "kill_part" && ++part_writes_ == spec_.n) {
      // Once per run (every rank and restart share the marker next to the journal).
      int mfd = ::open((journal_ + ".fired").c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
      if (mfd >= 0) {
        ::close(mfd);
        injected("write", path);
        ::raise(SIGKILL);
      }
    } else if (spec_.kind != "kill_part") {
      ++part_writes_;
    }
  }
  if ((spec_.kind == "enospc" && w >= spec_.n) || (spec_.kind == "eio" && w == spec_.n)) {
    if (w == spec_.n) injected("write", path_of(fd));  // enospc: the first of the failing writes
    return spec_.kind == "enospc" ? ENOSPC : EIO;
  }
  return FileSystem::write(fd, data, n, written);
}

int FaultFileSystem::sync(int fd) {
  tick("fsync", nullptr, fd);
  if (spec_.kind == "fsync_eio" && ++syncs_ == spec_.n) {
    injected("fsync", path_of(fd));
    return EIO;
  }
  if (spec_.kind != "fsync_eio") ++syncs_;
  int e = FileSystem::sync(fd);
  if (e == 0 && tracking()) {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = open_.find(fd); it != open_.end()) it->second.synced = file_size(fd);
  }
  return e;
}

int FaultFileSystem::close(int fd) {
  tick("close", nullptr, fd);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = open_.find(fd); it != open_.end()) {
      if (tracking() && file_size(fd) != it->second.synced) unsynced_[it->second.path] = it->second.synced;
      open_.erase(it);
    }
  }
  return FileSystem::close(fd);
}

int FaultFileSystem::rename(const char* from, const char* to) {
  tick("rename", from);
  const long r = ++renames_;
  if (spec_.kind == "kill_rename" && r == spec_.n) {
    injected("rename", norm(from) + " -> " + norm(to));
    ::raise(SIGKILL);
  }
  Rename rec{norm(from), norm(to), ""};
  if (tracking()) {
    std::lock_guard<std::mutex> lock(mu_);
    struct stat st {};
    if (::lstat(rec.to.c_str(), &st) == 0 && S_ISREG(st.st_mode)) {
      rec.stash = rec.to + ".powercut-old." + std::to_string(r);
      if (::link(rec.to.c_str(), rec.stash.c_str()) != 0) rec.stash.clear();
    }
  }
  int e = FileSystem::rename(from, to);
  if (e != 0) {
    if (!rec.stash.empty()) ::unlink(rec.stash.c_str());
    return e;
  }
  if (is_checkpoint_dir(rec.to)) {
    std::lock_guard<std::mutex> lock(mu_);
    pending_ckpt_.push_back(rec.to);
  }
  if (tracking()) {
    std::lock_guard<std::mutex> lock(mu_);
    // Paths under a renamed directory moved with it.
    auto move = [&](std::string& p) {
      if (under(p, rec.from)) p = rec.to + p.substr(rec.from.size());
    };
    for (auto& p : created_) move(p);
    for (auto& [fd, f] : open_) move(f.path);
    std::map<std::string, long long> moved;
    for (const auto& [path, size] : unsynced_) {
      std::string p = path;
      move(p);
      moved[p] = size;
    }
    unsynced_ = std::move(moved);
    renamed_.push_back(rec);
  }
  if (spec_.kind == "kill_renamed" && r == spec_.n) {
    injected("renamed", rec.from + " -> " + rec.to);
    ::raise(SIGKILL);
  }
  return 0;
}

int FaultFileSystem::sync_dir(const char* dir) {
  tick("fsync_dir", dir);
  ++sync_dirs_;
  int e = FileSystem::sync_dir(dir);
  if (e != 0) return e;
  const std::string d = norm(dir);
  std::vector<std::string> durable;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto in_dir = [&](const std::string& p) { return parent(p) == d; };
    std::vector<std::string> keep;
    for (auto& p : pending_ckpt_) (in_dir(p) ? durable : keep).push_back(p);
    pending_ckpt_ = keep;
    if (tracking()) {
      std::vector<std::string> still;
      for (auto& p : created_)
        if (!in_dir(p)) still.push_back(p);
      created_ = still;
      std::vector<Rename> rs;
      for (auto& r : renamed_) {
        if (!in_dir(r.to)) rs.push_back(r);
        else if (!r.stash.empty()) ::unlink(r.stash.c_str());
      }
      renamed_ = rs;
    }
  }
  for (auto& p : durable) journal("durable " + p);
  return 0;
}

int FaultFileSystem::remove(const char* path) {
  tick("remove", path);
  return FileSystem::remove(path);
}

void FaultFileSystem::power_cut() {
  // No lock: the cut is final, and the process dies below (another thread may be mid-call).
  for (auto& [fd, f] : open_) (void)::ftruncate(fd, f.synced);
  for (auto& [p, s] : unsynced_) (void)::truncate(p.c_str(), s);
  for (auto it = renamed_.rbegin(); it != renamed_.rend(); ++it) {
    (void)::rename(it->to.c_str(), it->from.c_str());
    if (!it->stash.empty()) (void)::rename(it->stash.c_str(), it->to.c_str());
  }
  for (auto& p : created_) {
    struct stat st {};
    if (::lstat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode)) ::unlink(p.c_str());
  }
  ::raise(SIGKILL);
}

void FaultFileSystem::journal(const std::string& line) const {
  if (journal_.empty()) return;
  const std::string text = line + "\n";
  int fd = ::open(journal_.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) return;
  (void)!::write(fd, text.data(), text.size());
  ::close(fd);
}

std::string FaultFileSystem::counts() const {
  return "calls=" + std::to_string(calls_.load()) + " writes=" + std::to_string(writes_.load()) +
         " syncs=" + std::to_string(syncs_.load()) + " renames=" + std::to_string(renames_.load()) +
         " sync_dirs=" + std::to_string(sync_dirs_.load()) + " part_writes=" + std::to_string(part_writes_.load());
}

}  // namespace lm::faults
