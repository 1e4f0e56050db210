// Token shard writer and memory-mapped reader (see shard.h; byte layout in FORMAT.md).
#include "data/format/shard.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/errors.h"
#include "common/checksum.h"
#include "common/files.h"
#include "common/log.h"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "shards are little-endian; this host is not");

namespace lm::data {
namespace {

constexpr char kMagic[8] = {'L', 'M', 'S', 'H', 'A', 'R', 'D', '\0'};
constexpr uint32_t kVersion = 1;
constexpr uint64_t kHeaderBytes = 64;

// The 64-byte header at offset 0 (FORMAT.md, "Header").
struct Header {
  char magic[8];
  uint32_t version;
  uint32_t token_bytes;    // 2 or 4
  uint64_t num_docs;
  uint64_t num_tokens;
  uint64_t index_offset;   // always kHeaderBytes
  uint64_t tokens_offset;  // index_offset + 8 * (num_docs + 1)
  uint8_t reserved[16];
};
static_assert(sizeof(Header) == kHeaderBytes, "header layout");

}  // namespace

TokenDtype dtype_for_vocab(uint64_t vocab_size) {
  return vocab_size <= (uint64_t{1} << 16) ? TokenDtype::kU16 : TokenDtype::kU32;
}

ShardWriter::ShardWriter(const std::string& path, TokenDtype dtype) : path_(path), dtype_(dtype) {}

ShardWriter::~ShardWriter() = default;

void ShardWriter::add_document(const uint32_t* tokens, size_t n) {
  if (finished_) throw Error(path_ + ": add_document after finish");
  size_t at = tokens_.size();
  if (dtype_ == TokenDtype::kU16) {
    tokens_.resize(at + 2 * n);
    for (size_t i = 0; i < n; ++i) {
      if (tokens[i] > 0xFFFF) throw Error(strf("%s: token id %u does not fit uint16", path_.c_str(), tokens[i]));
      uint16_t v = static_cast<uint16_t>(tokens[i]);
      std::memcpy(&tokens_[at + 2 * i], &v, 2);
    }
  } else {
    tokens_.resize(at + 4 * n);
    std::memcpy(&tokens_[at], tokens, 4 * n);
  }
  offsets_.push_back(offsets_.back() + n);
}

uint64_t ShardWriter::finish() {
  if (finished_) throw Error(path_ + ": finish called twice");
  Header h{};
  std::memcpy(h.magic, kMagic, sizeof kMagic);
  h.version = kVersion;
  h.token_bytes = static_cast<uint32_t>(dtype_);
  h.num_docs = num_docs();
  h.num_tokens = num_tokens();
  h.index_offset = kHeaderBytes;
  h.tokens_offset = kHeaderBytes + 8 * offsets_.size();
  files::AtomicFile f(path_);
  f.write(&h, sizeof h);
  f.write(offsets_.data(), 8 * offsets_.size());
  f.write(tokens_.data(), tokens_.size());
  f.commit();
  finished_ = true;
  tokens_ = {};
  return xxh64_file(path_);
}

std::shared_ptr<const MemoryShard> ShardWriter::finish_in_memory() {
  if (finished_) throw Error(path_ + ": finish called twice");
  auto m = std::make_shared<MemoryShard>();
  m->dtype = dtype_;
  m->offsets = std::move(offsets_);
  m->tokens = std::move(tokens_);
  finished_ = true;
  return m;
}

ShardReader::ShardReader(std::string name, std::shared_ptr<const MemoryShard> shard)
    : hold_(shard), path_(std::move(name)), dtype_(shard->dtype), num_docs_(shard->offsets.size() - 1),
      num_tokens_(shard->offsets.back()), index_(shard->offsets.data()), tokens_(shard->tokens.data()) {}

ShardReader::ShardReader(const std::string& path) : path_(path) {
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) throw DataError(path + ": cannot open shard (" + std::strerror(errno) + ")");
  struct stat st {};
  if (::fstat(fd, &st) != 0 || st.st_size < static_cast<off_t>(kHeaderBytes)) {
    ::close(fd);
    throw DataError(path + ": not a token shard (shorter than its 64-byte header)");
  }
  size_ = static_cast<size_t>(st.st_size);
  void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) throw DataError(path + ": mmap failed (" + std::strerror(errno) + ")");
  base_ = static_cast<const uint8_t*>(p);

  auto fail = [&](const std::string& why) {
    ::munmap(const_cast<uint8_t*>(base_), size_);
    throw DataError(path + ": " + why);
  };
  Header h;
  std::memcpy(&h, base_, sizeof h);
  if (std::memcmp(h.magic, kMagic, sizeof kMagic) != 0) fail("not a token shard (bad magic)");
  if (h.version != kVersion) fail(strf("unsupported shard format version %u (expected %u)", h.version, kVersion));
  if (h.token_bytes != 2 && h.token_bytes != 4) fail(strf("bad token width %u", h.token_bytes));
  if (h.index_offset != kHeaderBytes || h.num_docs > (size_ - kHeaderBytes) / 8 ||
      h.tokens_offset != kHeaderBytes + 8 * (h.num_docs + 1))
    fail("corrupt header (index offsets)");
  if (h.tokens_offset > size_ || (size_ - h.tokens_offset) / h.token_bytes != h.num_tokens ||
      (size_ - h.tokens_offset) % h.token_bytes != 0)
    fail(strf("file size %zu does not match its header (%llu tokens): truncated or corrupt", size_,
              static_cast<unsigned long long>(h.num_tokens)));
  dtype_ = static_cast<TokenDtype>(h.token_bytes);
  num_docs_ = h.num_docs;
  num_tokens_ = h.num_tokens;
  index_ = reinterpret_cast<const uint64_t*>(base_ + h.index_offset);
  tokens_ = base_ + h.tokens_offset;
  if (index_[0] != 0 || index_[num_docs_] != num_tokens_) fail("corrupt document index");
  for (uint64_t i = 0; i < num_docs_; ++i)
    if (index_[i] > index_[i + 1]) fail(strf("corrupt document index at document %llu", static_cast<unsigned long long>(i)));
}

ShardReader::~ShardReader() {
  if (base_) ::munmap(const_cast<uint8_t*>(base_), size_);
}

uint64_t ShardReader::doc_offset(uint64_t i) const {
  if (i > num_docs_)
    throw Error(strf("%s: document %llu out of range (%llu documents)", path_.c_str(),
                     static_cast<unsigned long long>(i), static_cast<unsigned long long>(num_docs_)));
  return index_[i];
}

void ShardReader::read_tokens(uint64_t begin, uint64_t n, uint32_t* out) const {
  if (begin > num_tokens_ || n > num_tokens_ - begin)
    throw Error(strf("%s: tokens [%llu, +%llu) out of range (%llu tokens)", path_.c_str(),
                     static_cast<unsigned long long>(begin), static_cast<unsigned long long>(n),
                     static_cast<unsigned long long>(num_tokens_)));
  if (n == 0) return;  // an empty document: `out` may be null (found by tests/fuzz, fuzz_shard)
  if (dtype_ == TokenDtype::kU32) {
    std::memcpy(out, tokens_ + 4 * begin, 4 * n);
    return;
  }
  const uint8_t* p = tokens_ + 2 * begin;
  for (uint64_t i = 0; i < n; ++i) {
    uint16_t v;
    std::memcpy(&v, p + 2 * i, 2);
    out[i] = v;
  }
}

std::vector<uint32_t> ShardReader::read_doc(uint64_t i) const {
  std::vector<uint32_t> out(doc_length(i));
  read_tokens(doc_offset(i), out.size(), out.data());
  return out;
}

}  // namespace lm::data
