// Atomic file writes and read helpers (see files.h).
#include "common/files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#define XXH_STATIC_LINKING_ONLY  // XXH64_state_t on the stack
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/checksum.h"
#include "common/errors.h"

namespace lm::files {
namespace {

std::string errno_text() { return std::strerror(errno); }

std::string errno_text(int e) { return std::strerror(e); }

std::string parent_dir(const std::string& path) {
  auto p = std::filesystem::path(path).parent_path().string();
  return p.empty() ? "." : p;
}

FileSystem g_posix;
FileSystem* g_fs = &g_posix;

// Writes all n bytes through `fs`, retrying short writes and EINTR; 0 or an errno value.
int write_all(FileSystem& fs, int fd, const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    size_t w = 0;
    int e = fs.write(fd, p, n, &w);
    if (e == EINTR) continue;
    if (e != 0) return e;
    if (w == 0) return EIO;
    p += w, n -= w;
  }
  return 0;
}

}  // namespace

int FileSystem::open_for_write(const char* path, int* fd) {
  *fd = ::open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  return *fd < 0 ? errno : 0;
}
int FileSystem::write(int fd, const void* data, size_t n, size_t* written) {
  ssize_t w = ::write(fd, data, n);
  if (w < 0) return errno;
  *written = static_cast<size_t>(w);
  return 0;
}
int FileSystem::sync(int fd) { return ::fsync(fd) == 0 ? 0 : errno; }
int FileSystem::close(int fd) { return ::close(fd) == 0 ? 0 : errno; }
int FileSystem::rename(const char* from, const char* to) { return std::rename(from, to) == 0 ? 0 : errno; }
int FileSystem::sync_dir(const char* dir) {
  int fd = ::open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return errno;
  int e = ::fsync(fd) == 0 ? 0 : errno;
  ::close(fd);
  return e == EINVAL ? 0 : e;  // EINVAL: this file system does not sync directories
}
int FileSystem::remove(const char* path) { return ::unlink(path) == 0 ? 0 : errno; }

FileSystem& file_system() { return *g_fs; }
void set_file_system(FileSystem* fs) { g_fs = fs ? fs : &g_posix; }

std::string read_file(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw DataError(path + ": cannot open for reading (" + errno_text() + ")");
  struct stat sb;
  std::string out;
  if (::fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode)) {
    out.resize(static_cast<size_t>(sb.st_size));
    try {
      pread_all(fd, path, 0, out.data(), out.size());
    } catch (...) {
      ::close(fd);
      throw;
    }
  } else {  // a pipe or other stream: read to the end
    char buf[65536];
    ssize_t n;
    while ((n = ::read(fd, buf, sizeof buf)) > 0) out.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return out;
}

void write_file_atomic(const std::string& path, const std::string& bytes) {
  AtomicFile f(path);
  f.write(bytes);
  f.commit();
}

namespace {
constexpr size_t kAtomicBuffer = size_t{1} << 20;
}  // namespace

AtomicFile::AtomicFile(const std::string& path)
    : path_(path), tmp_(path + ".tmp." + std::to_string(::getpid())) {
  if (int e = file_system().open_for_write(tmp_.c_str(), &fd_); e != 0) {
    fd_ = -1;
    throw Error(tmp_ + ": cannot create (" + errno_text(e) + ")");
  }
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) {
    file_system().close(fd_);
    file_system().remove(tmp_.c_str());
  }
}

void AtomicFile::flush_buffer() {
  if (buf_.empty()) return;
  if (int e = write_all(file_system(), fd_, buf_.data(), buf_.size()); e != 0)
    throw Error(tmp_ + ": write failed (" + errno_text(e) + ")");
  buf_.clear();
}

void AtomicFile::write(const void* data, size_t n) {
  if (n == 0) return;
  if (fd_ < 0) throw Error(path_ + ": write after commit");
  if (buf_.size() + n > kAtomicBuffer) flush_buffer();
  if (n >= kAtomicBuffer) {
    if (int e = write_all(file_system(), fd_, data, n); e != 0) throw Error(tmp_ + ": write failed (" + errno_text(e) + ")");
  } else {
    buf_.append(static_cast<const char*>(data), n);
  }
  written_ += n;
}

void AtomicFile::commit() {
  if (fd_ < 0) throw Error(path_ + ": commit called twice");
  flush_buffer();
  if (int e = file_system().sync(fd_); e != 0) throw Error(tmp_ + ": flush/fsync failed (" + errno_text(e) + ")");
  const int fd = fd_;
  fd_ = -1;
  if (int e = file_system().close(fd); e != 0) {
    file_system().remove(tmp_.c_str());
    throw Error(tmp_ + ": close failed (" + errno_text(e) + ")");
  }
  if (int e = file_system().rename(tmp_.c_str(), path_.c_str()); e != 0) {
    file_system().remove(tmp_.c_str());
    throw Error(path_ + ": rename from temp failed (" + errno_text(e) + ")");
  }
  fsync_dir(parent_dir(path_));
}

uint64_t FilePlan::size() const {
  uint64_t n = head.size();
  for (const auto& s : spans) n += s.size;
  return n;
}

std::string write_plan(const std::string& dir, const FilePlan& plan, WrittenFile* out) {
  const std::string path = dir + "/" + plan.name;
  FileSystem& fs = file_system();
  int fd = -1;
  if (int e = fs.open_for_write(path.c_str(), &fd); e != 0) return path + ": cannot create (" + errno_text(e) + ")";
  XXH64_state_t st;
  XXH64_reset(&st, 0);
  // Each 32 MB written is handed to writeback at once (sync_file_range), so the disk writes chunk
  // i while chunk i+1 is copied into the page cache; the final fsync then waits for little.
  constexpr size_t kChunk = size_t{1} << 25;
  uint64_t written = 0, flushed = 0;
  int err_no = 0;
  auto put = [&](const void* data, size_t n) -> bool {
    XXH64_update(&st, data, n);
    const char* p = static_cast<const char*>(data);
    while (n > 0) {
      size_t w = 0;
      int e = fs.write(fd, p, std::min(n, kChunk), &w);
      if (e == EINTR) continue;
      if (e != 0 || w == 0) {
        err_no = e != 0 ? e : EIO;
        return false;
      }
      p += w;
      n -= w;
      written += w;
      if (written - flushed >= kChunk) {
        ::sync_file_range(fd, static_cast<off_t>(flushed), static_cast<off_t>(written - flushed), SYNC_FILE_RANGE_WRITE);
        flushed = written;
      }
    }
    return true;
  };
  bool ok = put(plan.head.data(), plan.head.size());
  for (size_t i = 0; ok && i < plan.spans.size(); ++i) ok = put(plan.spans[i].data, plan.spans[i].size);
  if (ok && (err_no = fs.sync(fd)) != 0) ok = false;
  std::string err = ok ? "" : path + ": write failed (" + errno_text(err_no) + ")";
  if (int e = fs.close(fd); e != 0 && ok) err = path + ": close failed (" + errno_text(e) + ")";
  if (err.empty() && out) *out = {plan.name, plan.size(), XXH64_digest(&st)};
  return err;
}

std::string try_fsync_dir(const std::string& dir) {
  int e = file_system().sync_dir(dir.c_str());
  return e == 0 ? "" : dir + ": directory fsync failed (" + errno_text(e) + ")";
}

void fsync_dir(const std::string& dir) {
  if (auto err = try_fsync_dir(dir); !err.empty()) throw Error(err);
}

std::string try_rename(const std::string& from, const std::string& to) {
  int e = file_system().rename(from.c_str(), to.c_str());
  return e == 0 ? "" : to + ": rename from " + from + " failed (" + errno_text(e) + ")";
}

void make_dirs(const std::string& dir) {
  // Each directory made here becomes durable only when its parent is fsync'd (a crash could
  // otherwise lose the new entry and everything committed below it).
  std::vector<std::filesystem::path> made;
  for (auto p = std::filesystem::path(dir); !p.empty() && !exists(p.string()); p = p.parent_path()) {
    made.push_back(p);
    if (p == p.parent_path()) break;
  }
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw Error(dir + ": cannot create directory (" + ec.message() + ")");
  for (auto it = made.rbegin(); it != made.rend(); ++it) fsync_dir(parent_dir(it->string()));
}

void remove_all(const std::string& path) {
  std::error_code ec;
  std::filesystem::remove_all(path, ec);
}

bool exists(const std::string& path) {
  std::error_code ec;
  return std::filesystem::exists(path, ec);
}

void pread_all(int fd, const std::string& path, uint64_t offset, void* dst, size_t n) {
  char* p = static_cast<char*>(dst);
  while (n > 0) {
    ssize_t r = ::pread(fd, p, std::min<size_t>(n, size_t{1} << 30), static_cast<off_t>(offset));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) throw DataError(path + (r == 0 ? ": unexpected end of file" : ": read failed (" + errno_text() + ")"));
    p += r, offset += static_cast<uint64_t>(r), n -= static_cast<size_t>(r);
  }
}

}  // namespace lm::files
