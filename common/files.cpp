// Atomic file writes and read helpers (see files.h).
#include "common/files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#define XXH_STATIC_LINKING_ONLY  // XXH64_state_t on the stack
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/checksum.h"
#include "common/errors.h"
#include "common/parallel.h"

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
int FileSystem::set_direct(int fd, bool on) {
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags < 0) return errno;
  return ::fcntl(fd, F_SETFL, on ? flags | O_DIRECT : flags & ~O_DIRECT) == 0 ? 0 : errno;
}
int FileSystem::truncate(int fd, uint64_t size) { return ::ftruncate(fd, static_cast<off_t>(size)) == 0 ? 0 : errno; }
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

std::vector<std::string> tail_lines(const std::string& path, int n) {
  std::ifstream in(path);
  std::deque<std::string> q;
  std::string line;
  while (std::getline(in, line)) {
    q.push_back(line);
    if (static_cast<int>(q.size()) > n) q.pop_front();
  }
  return {q.begin(), q.end()};
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

namespace {

// Streams a plan's bytes into an open file and hashes them. Large files whose bytes start at an
// aligned address are written with O_DIRECT where the file system takes it, from the plan's memory
// (an unaligned rest through an aligned bounce buffer): the data goes from memory to the disk,
// with no copy into the page cache and no writeback of dirty pages (measured here, dd of 1.5 GB:
// 2.6 s of kernel CPU buffered, 0.4 s direct, at the same disk speed; that CPU is what an async
// save takes from training). Otherwise, buffered, with writeback started every 32 MB.
class PlanWriter {
 public:
  static constexpr size_t kChunk = size_t{1} << 25;         // largest write(); writeback step
  static constexpr size_t kBounce = size_t{8} << 20;        // direct mode's buffer
  static constexpr size_t kBlock = 4096;                    // direct I/O alignment
  static constexpr uint64_t kDirectMin = uint64_t{1} << 20;  // smaller files: buffered
  static constexpr size_t kHashPiece = size_t{1} << 20;      // checksum step (see hash())

  // aligned: the plan's bytes start at a kBlock-aligned address (a staged image); others are
  // written buffered, as before (through the bounce buffer each direct write would wait for its
  // copy, and a synchronous save gains nothing from sparing CPU).
  PlanWriter(FileSystem& fs, int fd, uint64_t size, bool aligned) : fs_(fs), fd_(fd) {
    XXH64_reset(&st_, 0);
    if (size < kDirectMin || !aligned || fs_.set_direct(fd_, true) != 0) return;
    buf_ = static_cast<char*>(std::aligned_alloc(kBlock, kBounce));
    direct_ = buf_ != nullptr;
    if (!direct_) fs_.set_direct(fd_, false);
  }
  ~PlanWriter() { std::free(buf_); }
  PlanWriter(const PlanWriter&) = delete;
  PlanWriter& operator=(const PlanWriter&) = delete;

  // Appends n bytes; false on an error (err_no()).
  bool put(const void* data, size_t n) {
    const char* p = static_cast<const char*>(data);
    if (!buf_) {
      hash(p, n);
      return out(p, n);
    }
    // Aligned memory at an aligned file offset (a staged image, checkpoint/staging.h): written
    // straight from where it is, hashed piece by piece just before each piece is written.
    while (direct_ && fill_ == 0 && written_ % kBlock == 0 && reinterpret_cast<uintptr_t>(p) % kBlock == 0 &&
           n >= kBlock) {
      const size_t k = std::min(n, kBounce) / kBlock * kBlock;
      hash(p, k);
      if (!out(p, k)) return false;
      p += k, n -= k;
    }
    while (n > 0) {  // copied, hashed while in cache, written when the buffer is full
      const size_t k = std::min(n, kBounce - fill_);
      std::memcpy(buf_ + fill_, p, k);
      hash(buf_ + fill_, k);
      fill_ += k, p += k, n -= k;
      if (fill_ == kBounce && !out(buf_, fill_)) return false;
      if (fill_ == kBounce) fill_ = 0;
    }
    return true;
  }
  // Writes what the buffer holds (direct: padded to a block, then the file cut to `size`).
  bool finish(uint64_t size) {
    if (buf_ && fill_ > 0) {
      size_t n = fill_;
      if (direct_) n = (fill_ + kBlock - 1) / kBlock * kBlock, std::memset(buf_ + fill_, 0, n - fill_);
      if (!out(buf_, n)) return false;
    }
    if (written_ > size && (err_no_ = fs_.truncate(fd_, size)) != 0) return false;
    return true;
  }
  int err_no() const { return err_no_; }
  uint64_t digest() const { return XXH64_digest(&st_); }

 private:
  // Hashes in pieces of 1 MB; a background thread (the async checkpoint writer) gives the CPU
  // back between them (common/parallel.h).
  void hash(const char* p, size_t n) {
    for (size_t o = 0; o < n; o += kHashPiece) {
      XXH64_update(&st_, p + o, std::min(kHashPiece, n - o));
      yield_if_background();
    }
  }

  // Writes n bytes at the end of the file. A direct write refused with EINVAL (an unaligned rest
  // after a short write, a file system that accepts the flag but not the I/O) turns direct I/O
  // off and is retried buffered.
  bool out(const char* p, size_t n) {
    while (n > 0) {
      size_t w = 0;
      int e = fs_.write(fd_, p, std::min(n, kChunk), &w);
      if (e == EINTR) continue;
      if (e == EINVAL && direct_ && fs_.set_direct(fd_, false) == 0) {
        direct_ = false;
        continue;
      }
      if (e != 0 || w == 0) {
        err_no_ = e != 0 ? e : EIO;
        return false;
      }
      p += w, n -= w, written_ += w;
      if (!direct_ && written_ - flushed_ >= kChunk) {
        ::sync_file_range(fd_, static_cast<off_t>(flushed_), static_cast<off_t>(written_ - flushed_), SYNC_FILE_RANGE_WRITE);
        flushed_ = written_;
      }
    }
    return true;
  }

  FileSystem& fs_;
  int fd_;
  XXH64_state_t st_;
  char* buf_ = nullptr;  // direct mode's bounce buffer (kBounce bytes, kBlock-aligned)
  size_t fill_ = 0;
  bool direct_ = false;
  uint64_t written_ = 0, flushed_ = 0;
  int err_no_ = 0;
};

}  // namespace

std::string try_write_plan(const std::string& dir, const FilePlan& plan, WrittenFile* out) {
  const std::string path = dir + "/" + plan.name;
  FileSystem& fs = file_system();
  int fd = -1;
  if (int e = fs.open_for_write(path.c_str(), &fd); e != 0) return path + ": cannot create (" + errno_text(e) + ")";
  const uint64_t size = plan.size();
  int err_no = 0;
  uint64_t digest = 0;
  {
    const bool aligned = plan.head.empty() && !plan.spans.empty() &&
                         reinterpret_cast<uintptr_t>(plan.spans[0].data) % PlanWriter::kBlock == 0;
    PlanWriter w(fs, fd, size, aligned);
    bool ok = w.put(plan.head.data(), plan.head.size());
    for (size_t i = 0; ok && i < plan.spans.size(); ++i) ok = w.put(plan.spans[i].data, plan.spans[i].size);
    ok = ok && w.finish(size);
    err_no = ok ? fs.sync(fd) : w.err_no();
    digest = w.digest();
  }
  std::string err = err_no == 0 ? "" : path + ": write failed (" + errno_text(err_no) + ")";
  if (int e = fs.close(fd); e != 0 && err.empty()) err = path + ": close failed (" + errno_text(e) + ")";
  if (err.empty() && out) *out = {plan.name, size, digest};
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
