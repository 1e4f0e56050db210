// xxh64 checksums (see checksum.h).
#include "common/checksum.h"

#define XXH_STATIC_LINKING_ONLY  // XXH64_state_t on the stack
#include <xxhash.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "common/errors.h"

namespace lm {

uint64_t xxh64(const void* data, size_t n, uint64_t seed) { return XXH64(data, n, seed); }

Xxh64::Xxh64() : state_(XXH64_createState()) { XXH64_reset(static_cast<XXH64_state_t*>(state_), 0); }
Xxh64::~Xxh64() { XXH64_freeState(static_cast<XXH64_state_t*>(state_)); }
void Xxh64::update(const void* data, size_t n) { XXH64_update(static_cast<XXH64_state_t*>(state_), data, n); }
uint64_t Xxh64::digest() const { return XXH64_digest(static_cast<XXH64_state_t*>(state_)); }

uint64_t xxh64_file(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) throw DataError(path + ": cannot open for reading (" + std::strerror(errno) + ")");
  XXH64_state_t* st = XXH64_createState();
  XXH64_reset(st, 0);
  std::string buf(1 << 20, '\0');
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), f)) > 0) XXH64_update(st, buf.data(), n);
  bool bad = std::ferror(f);
  std::fclose(f);
  uint64_t h = XXH64_digest(st);
  XXH64_freeState(st);
  if (bad) throw DataError(path + ": read failed");
  return h;
}

std::string hex64(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

}  // namespace lm
