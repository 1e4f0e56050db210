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

// Whole file as bytes. Throws DataError naming the path when it cannot be read.
std::string read_file(const std::string& path);
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
  std::string path_, tmp_;
  std::FILE* f_ = nullptr;
  uint64_t written_ = 0;
};

// A file described as a head string followed by byte spans (e.g. a safetensors header and tensor
// data). write_plan() writes it without throwing or allocating per span, so it is also safe in a
// forked child (the async checkpoint writer).
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
std::string write_plan(const std::string& dir, const FilePlan& plan, WrittenFile* out);

// fsync a directory so a rename inside it is durable.
void fsync_dir(const std::string& dir);
// mkdir -p. Throws lm::Error on failure.
void make_dirs(const std::string& dir);
// rm -rf; no error when missing.
void remove_all(const std::string& path);
bool exists(const std::string& path);

// Reads exactly n bytes at `offset` of fd into dst. Throws DataError naming `path` otherwise.
void pread_all(int fd, const std::string& path, uint64_t offset, void* dst, size_t n);

}  // namespace lm::files
