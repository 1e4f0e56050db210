// Files we write and read: temp-then-rename atomic writes with fsync of files and directories,
// and read helpers. Checksums are in common/checksum.h.
//
// Contract: a file written through AtomicFile or write_file_atomic() either has its complete new
// content under its final name, or the final name is untouched (a crash leaves at most a
// "*.tmp.<pid>" file behind). Errors throw lm::Error (exit 1) naming the path, except reads of
// missing or unreadable input, which throw DataError (exit 2).
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace lm::files {

// The file-system calls every write path goes through (atomic files, write plans, directory
// fsyncs, the checkpoint commit rename), as leveldb's Env: the production implementation is plain
// POSIX; tests install their own (set_file_system) to inject ENOSPC, EIO, short writes, failed
// fsync or rename. Each method returns 0 or an errno value and none throws (the async checkpoint
// writer thread calls them).
class FileSystem {
 public:
  virtual ~FileSystem() = default;
  // Creates or truncates `path` for writing (mode 0644, close-on-exec); *fd on success.
  virtual int open_for_write(const char* path, int* fd);
  // Writes up to n bytes; *written gets how many (a short write is not an error here).
  virtual int write(int fd, const void* data, size_t n, size_t* written);
  // Turns direct I/O (O_DIRECT: no page cache; writes aligned to 4096 bytes) on or off for fd.
  virtual int set_direct(int fd, bool on);
  virtual int truncate(int fd, uint64_t size);  // ftruncate
  virtual int sync(int fd);       // fsync of a file
  virtual int close(int fd);
  virtual int rename(const char* from, const char* to);
  virtual int sync_dir(const char* dir);  // fsync of a directory (makes renames inside it durable)
  virtual int remove(const char* path);   // unlink a file
};

// The file system in use (the POSIX one unless a test installed another).
FileSystem& file_system();
// Installs `fs` for the whole process; nullptr restores the POSIX one. REQUIRES: no write in
// flight on another thread. The caller keeps ownership.
void set_file_system(FileSystem* fs);

// Whole file as bytes. Throws DataError naming the path when it cannot be read.
std::string read_file(const std::string& path);
// The last `n` lines of a file (fewer when it has fewer; none when it cannot be read).
std::vector<std::string> tail_lines(const std::string& path, int n);
// Writes `bytes` to `path` atomically (temp file in the same directory, fsync, rename, fsync dir).
void write_file_atomic(const std::string& path, const std::string& bytes);

// Streaming atomic writer. Destroying it without commit() removes the temp file.
class AtomicFile {
 public:
  explicit AtomicFile(const std::string& path);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void write(const void* data, size_t n);
  void write(const std::string& s) { write(s.data(), s.size()); }
  uint64_t bytes_written() const { return written_; }
  // fsync, rename to the final name, fsync the directory.
  void commit();

 private:
  void flush_buffer();
  std::string path_, tmp_;
  int fd_ = -1;
  std::string buf_;  // pending bytes, written in large blocks
  uint64_t written_ = 0;
};

// A file described as a head string followed by byte spans (e.g. a safetensors header and tensor
// data). try_write_plan() writes it without throwing. A file of 1 MB or more with no head whose first
// span starts 4096-byte aligned (an image staged for it: trainer/checkpoint/staging.h) is written
// with direct I/O from that memory where the file system supports it (no page-cache copy); others
// buffered.
struct Span {
  const void* data;
  size_t size;
};
struct FilePlan {
  std::string name;  // file name inside the target directory
  std::string head;
  std::vector<Span> spans;
  uint64_t size() const;
};
struct WrittenFile {
  std::string name;
  uint64_t bytes = 0;
  uint64_t xxh64 = 0;
};
// Writes dir/plan.name (plain create + write + fsync; the caller makes the directory atomic).
// Returns "" on success, else an error message naming the file.
std::string try_write_plan(const std::string& dir, const FilePlan& plan, WrittenFile* out);

// fsync a directory so a rename inside it is durable. Throws lm::Error naming the directory when it
// cannot be opened or synced (EINVAL, a file system without directory fsync, is not an error).
void fsync_dir(const std::string& dir);
// "" or why fsync_dir(dir) failed; for callers that must not throw (the async checkpoint writer).
std::string try_fsync_dir(const std::string& dir);
// Renames `from` to `to` through the file system in use; "" or the error naming both.
std::string try_rename(const std::string& from, const std::string& to);
// mkdir -p, then fsync of the parent of every directory it created. Throws lm::Error on failure.
void make_dirs(const std::string& dir);
// rm -rf; no error when missing.
void remove_all(const std::string& path);
bool exists(const std::string& path);

// Reads exactly n bytes at `offset` of fd into dst. Throws DataError naming `path` otherwise.
void pread_all(int fd, const std::string& path, uint64_t offset, void* dst, size_t n);

}  // namespace lm::files
