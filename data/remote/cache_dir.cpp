// The shared local shard cache (see cache_dir.h).
#include "data/remote/cache_dir.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <tuple>
#include <vector>

#include "common/errors.h"
#include "common/files.h"
#include "common/log.h"

namespace lm::data {
namespace {

const char kPart[] = ".part";

bool is_part(const std::string& name) {
  return name.size() > 5 && name.compare(name.size() - 5, 5, kPart) == 0;
}

// The size a cache file's name promises ("<xxh64>-<bytes>-<file>[.part]"); 0 for foreign names.
uint64_t promised_bytes(const std::string& name) {
  if (name.size() < 19 || name[16] != '-') return 0;
  const size_t dash = name.find('-', 17);
  if (dash == std::string::npos) return 0;
  return std::strtoull(name.c_str() + 17, nullptr, 10);
}

// An fd closed (and so unlocked) by the destructor.
struct Fd {
  int fd = -1;
  explicit Fd(int f) : fd(f) {}
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
};

// True when fd still is the file at `path` (not unlinked or replaced since it was opened).
bool same_file(int fd, const std::string& path) {
  struct stat a {}, b {};
  return ::fstat(fd, &a) == 0 && ::stat(path.c_str(), &b) == 0 && a.st_ino == b.st_ino && a.st_dev == b.st_dev;
}

struct CacheFile {
  std::string name;
  uint64_t bytes = 0;
  int64_t mtime_ns = 0;
};

std::vector<CacheFile> list_cache(const std::string& dir) {
  std::vector<CacheFile> out;
  struct Closedir {
    void operator()(DIR* d) const { ::closedir(d); }
  };
  std::unique_ptr<DIR, Closedir> d(::opendir(dir.c_str()));
  if (!d) throw Error("data.cache_dir " + dir + ": cannot list (" + std::strerror(errno) + ")");
  while (const dirent* e = ::readdir(d.get())) {
    CacheFile f;
    f.name = e->d_name;
    f.bytes = promised_bytes(f.name);
    struct stat st {};
    if (f.bytes == 0 || ::stat((dir + "/" + f.name).c_str(), &st) != 0) continue;
    f.mtime_ns = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
    out.push_back(f);
  }
  return out;
}

}  // namespace

CacheDir::CacheDir(const std::string& dir, uint64_t limit_bytes) : dir_(dir), limit_(limit_bytes) {
  files::make_dirs(dir_);
}

std::string CacheDir::key(const std::string& xxh64, uint64_t bytes, const std::string& file) {
  return xxh64 + "-" + std::to_string(bytes) + "-" + file;
}

std::shared_ptr<const void> CacheDir::hold(const std::string& key) const {
  const std::string p = path(key);
  for (;;) {
    auto fd = std::make_shared<Fd>(::open(p.c_str(), O_RDONLY | O_CLOEXEC));
    if (fd->fd < 0) return nullptr;
    if (::flock(fd->fd, LOCK_SH) != 0) throw Error(p + ": flock failed (" + std::strerror(errno) + ")");
    if (!same_file(fd->fd, p)) continue;  // evicted between open and lock: look again
    ::futimens(fd->fd, nullptr);          // most recently used
    return fd;
  }
}

uint64_t CacheDir::used() const {
  uint64_t n = 0;
  for (const auto& f : list_cache(dir_)) n += f.bytes;
  return n;
}

bool CacheDir::reserve(const std::string& key, uint64_t bytes, const std::map<std::string, int>& keep, int rank) const {
  Fd lock(::open((dir_ + "/.lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
  if (lock.fd < 0 || ::flock(lock.fd, LOCK_EX) != 0)
    throw Error("data.cache_dir " + dir_ + ": cannot lock .lock (" + std::strerror(errno) + ")");
  const std::string part = path(key) + kPart;
  if (files::exists(part) || files::exists(path(key))) return true;  // being fetched, or done meanwhile
  std::vector<CacheFile> all = list_cache(dir_);
  uint64_t used = 0;
  for (const auto& f : all) used += f.bytes;
  // Eviction order: others' shards least recently used first, then ours from the farthest.
  auto keep_rank = [&](const CacheFile& f) {
    auto it = keep.find(is_part(f.name) ? f.name.substr(0, f.name.size() - 5) : f.name);
    return it == keep.end() ? -1 : it->second;
  };
  std::sort(all.begin(), all.end(), [&](const CacheFile& a, const CacheFile& b) {
    return std::make_tuple(keep_rank(a) >= 0, -keep_rank(a), a.mtime_ns) <
           std::make_tuple(keep_rank(b) >= 0, -keep_rank(b), b.mtime_ns);
  });
  for (const auto& f : all) {
    if (used + bytes <= limit_) break;
    const int r = keep_rank(f);
    if (r >= 0 && (rank < 0 || r <= rank)) continue;
    const std::string p = dir_ + "/" + f.name;
    Fd fd(::open(p.c_str(), O_RDONLY | O_CLOEXEC));
    if (fd.fd < 0 || ::flock(fd.fd, LOCK_EX | LOCK_NB) != 0) continue;  // in use (or being downloaded)
    if (!same_file(fd.fd, p) || ::unlink(p.c_str()) != 0) continue;
    used -= f.bytes;
    log::info(strf("data cache: evicted %s (%.1f MB)", f.name.c_str(), f.bytes / 1e6));
  }
  if (used + bytes > limit_) return false;
  Fd created(::open(part.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644));
  if (created.fd < 0) throw Error(part + ": cannot create (" + std::strerror(errno) + ")");
  return true;
}

int CacheDir::open_part(const std::string& key) const {
  const std::string p = path(key) + kPart;
  for (;;) {
    const int fd = ::open(p.c_str(), O_RDWR | O_APPEND | O_CLOEXEC);
    if (fd < 0) return -1;
    // Polls rather than blocks: once the download we wait for is committed, the inode is the
    // complete shard, which readers hold (shared) for as long as they use it.
    while (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      if (errno != EWOULDBLOCK || !same_file(fd, p)) break;
      ::usleep(20000);
    }
    if (same_file(fd, p) && ::flock(fd, LOCK_EX | LOCK_NB) == 0) return fd;
    ::close(fd);  // committed or evicted while we waited
    if (!files::exists(p)) return -1;
  }
}

void CacheDir::commit(const std::string& key, int fd) const {
  Fd owned(fd);
  const std::string p = path(key);
  if (files::file_system().sync(fd) != 0) throw Error(p + kPart + ": fsync failed");
  const std::string err = files::try_rename(p + kPart, p);
  if (!err.empty()) throw Error(err);
  files::fsync_dir(dir_);
}

void CacheDir::discard(const std::string& key, int fd) const {
  Fd owned(fd);
  files::file_system().remove((path(key) + kPart).c_str());
}

}  // namespace lm::data
