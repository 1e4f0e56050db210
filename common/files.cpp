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

std::string parent_dir(const std::string& path) {
  auto p = std::filesystem::path(path).parent_path().string();
  return p.empty() ? "." : p;
}

}  // namespace

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

AtomicFile::AtomicFile(const std::string& path)
    : path_(path), tmp_(path + ".tmp." + std::to_string(::getpid())) {
  f_ = std::fopen(tmp_.c_str(), "wb");
  if (!f_) throw Error(tmp_ + ": cannot create (" + errno_text() + ")");
}

AtomicFile::~AtomicFile() {
  if (f_) {
    std::fclose(f_);
    std::remove(tmp_.c_str());
  }
}

void AtomicFile::write(const void* data, size_t n) {
  if (n == 0) return;
  if (std::fwrite(data, 1, n, f_) != n) throw Error(tmp_ + ": write failed (" + errno_text() + ")");
  written_ += n;
}

void AtomicFile::commit() {
  if (!f_) throw Error(path_ + ": commit called twice");
  if (std::fflush(f_) != 0 || ::fsync(::fileno(f_)) != 0)
    throw Error(tmp_ + ": flush/fsync failed (" + errno_text() + ")");
  std::fclose(f_);
  f_ = nullptr;
  if (std::rename(tmp_.c_str(), path_.c_str()) != 0) {
    std::string err = errno_text();
    std::remove(tmp_.c_str());
    throw Error(path_ + ": rename from temp failed (" + err + ")");
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
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return path + ": cannot create (" + errno_text() + ")";
  XXH64_state_t st;
  XXH64_reset(&st, 0);
  // Each 32 MB written is handed to writeback at once (sync_file_range), so the disk writes chunk
  // i while chunk i+1 is copied into the page cache; the final fsync then waits for little.
  constexpr size_t kChunk = size_t{1} << 25;
  uint64_t written = 0, flushed = 0;
  auto put = [&](const void* data, size_t n) -> bool {
    XXH64_update(&st, data, n);
    const char* p = static_cast<const char*>(data);
    while (n > 0) {
      ssize_t w = ::write(fd, p, std::min(n, kChunk));
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) return false;
      p += w;
      n -= static_cast<size_t>(w);
      written += static_cast<uint64_t>(w);
      if (written - flushed >= kChunk) {
        ::sync_file_range(fd, static_cast<off_t>(flushed), static_cast<off_t>(written - flushed), SYNC_FILE_RANGE_WRITE);
        flushed = written;
      }
    }
    return true;
  };
  bool ok = put(plan.head.data(), plan.head.size());
  for (size_t i = 0; ok && i < plan.spans.size(); ++i) ok = put(plan.spans[i].data, plan.spans[i].size);
  ok = ok && ::fsync(fd) == 0;
  std::string err = ok ? "" : path + ": write failed (" + errno_text() + ")";
  if (::close(fd) != 0 && ok) err = path + ": close failed (" + errno_text() + ")";
  if (err.empty() && out) *out = {plan.name, plan.size(), XXH64_digest(&st)};
  return err;
}

void fsync_dir(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) return;  // best effort: some file systems do not allow it
  ::fsync(fd);
  ::close(fd);
}

void make_dirs(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw Error(dir + ": cannot create directory (" + ec.message() + ")");
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
