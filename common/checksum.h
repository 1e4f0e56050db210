// xxh64 checksums (seed 0) of buffers, streams and files, and their 16-digit hex form: the one
// checksum of every file this project writes (shards, manifests, checkpoints).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace lm {

// Streaming xxh64 (seed 0).
class Xxh64 {
 public:
  Xxh64();
  ~Xxh64();
  Xxh64(const Xxh64&) = delete;
  Xxh64& operator=(const Xxh64&) = delete;
  void update(const void* data, size_t n);
  uint64_t digest() const;

 private:
  void* state_;
};

// xxh64 of a buffer / of a file's bytes (streamed). Seed 0.
uint64_t xxh64(const void* data, size_t n, uint64_t seed = 0);
uint64_t xxh64_file(const std::string& path);
// 16 lowercase hex digits.
std::string hex64(uint64_t v);

}  // namespace lm
