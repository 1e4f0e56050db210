// Documents from raw text, and plain or zstd text files read from any line (see documents.h).
#include "data/text/documents.h"

#include <fcntl.h>
#include <unistd.h>
#include <zstd.h>

#include <cerrno>
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <limits>
#include <memory>

#include <nlohmann/json.hpp>

#include "common/checksum.h"
#include "common/errors.h"

namespace lm::data {
namespace {

constexpr size_t kReadBytes = 1 << 20;

struct Fd {
  int fd;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

int open_text(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw DataError(path + ": cannot open (" + std::strerror(errno) + ")");
  return fd;
}

size_t read_some(int fd, char* buf, size_t n, uint64_t at, const std::string& path) {
  for (;;) {
    const ssize_t r = ::pread(fd, buf, n, static_cast<off_t>(at));
    if (r >= 0) return static_cast<size_t>(r);
    if (errno != EINTR) throw DataError(path + ": read failed (" + std::strerror(errno) + ")");
  }
}

// The text's bytes [from, to) in pieces, to `emit`.
using Emit = std::function<void(const char*, size_t)>;

void read_plain(const std::string& path, uint64_t from, uint64_t to, const Emit& emit) {
  Fd f{open_text(path)};
  std::unique_ptr<char[]> buf(new char[kReadBytes]);
  for (uint64_t at = from; at < to;) {
    const size_t n = read_some(f.fd, buf.get(), static_cast<size_t>(std::min<uint64_t>(kReadBytes, to - at)), at, path);
    if (n == 0) break;
    emit(buf.get(), n);
    at += n;
  }
}

void read_zstd(const std::string& path, uint64_t from, uint64_t to, const std::vector<ZstdFrame>& frames,
               const Emit& emit, std::vector<ZstdFrame>* found) {
  ZstdFrame start;
  for (const auto& f : frames)
    if (f.plain <= from && f.plain >= start.plain) start = f;
  Fd f{open_text(path)};
  std::unique_ptr<ZSTD_DCtx, decltype(&ZSTD_freeDCtx)> d(ZSTD_createDCtx(), ZSTD_freeDCtx);
  if (!d) throw Error("zstd: cannot create a decompression context");
  const size_t out_cap = ZSTD_DStreamOutSize();
  std::unique_ptr<char[]> in_buf(new char[kReadBytes]), out_buf(new char[out_cap]);
  uint64_t packed = start.packed, plain = start.plain;
  size_t last = 1;  // ZSTD_decompressStream's last answer: 0 = a frame just ended
  if (found && start.packed == 0) found->push_back(start);
  while (plain < to) {
    const size_t n = read_some(f.fd, in_buf.get(), kReadBytes, packed, path);
    if (n == 0) break;
    ZSTD_inBuffer in{in_buf.get(), n, 0};
    for (bool full = false; (in.pos < in.size || full) && plain < to;) {  // full: output may be pending
      if (last == 0 && found && in.pos < in.size) found->push_back({packed + in.pos, plain});  // a frame starts
      ZSTD_outBuffer out{out_buf.get(), out_cap, 0};
      last = ZSTD_decompressStream(d.get(), &out, &in);
      if (ZSTD_isError(last)) throw DataError(path + ": zstd: " + ZSTD_getErrorName(last));
      const uint64_t b = std::max(plain, from), e = std::min(plain + out.pos, to);
      if (b < e) emit(out_buf.get() + (b - plain), static_cast<size_t>(e - b));
      plain += out.pos;
      full = out.pos == out_cap;
    }
    packed += in.pos;
  }
  if (plain < to && to != std::numeric_limits<uint64_t>::max())
    throw DataError(path + ": ends before byte " + std::to_string(to) + " of its text (truncated or changed)");
  if (last != 0 && to == std::numeric_limits<uint64_t>::max())
    throw DataError(path + ": truncated zstd stream (the last frame is incomplete)");
}

}  // namespace

bool is_blank(std::string_view s) { return s.find_first_not_of(" \t\r\n") == std::string_view::npos; }

bool is_val_document(const std::string& text, uint64_t seed, double val_fraction) {
  return static_cast<double>(xxh64(text.data(), text.size(), seed) >> 11) * 0x1.0p-53 < val_fraction;
}

bool is_zstd(const std::string& path) { return path.size() > 4 && path.compare(path.size() - 4, 4, ".zst") == 0; }

DocSplitter::DocSplitter(std::string docs, std::string text_field, std::string name, uint64_t first_line)
    : docs_(std::move(docs)), field_(std::move(text_field)), name_(std::move(name)), line_no_(first_line - 1) {}

bool DocSplitter::line(std::string_view line, uint64_t at, uint64_t end, TextDoc* doc) {
  ++line_no_;
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  const bool blank = is_blank(line);
  if (docs_ == "paragraph") {
    if (!blank) {
      if (para_.text.empty()) para_.begin = at, para_.line = line_no_;
      else para_.text += '\n';
      para_.text.append(line.data(), line.size());
      para_.end = end;
      return false;
    }
    return finish(doc);
  }
  if (blank) return false;
  doc->text = docs_ == "jsonl" ? jsonl_text(line) : std::string(line);
  doc->begin = at, doc->end = end, doc->line = line_no_;
  return !is_blank(doc->text);
}

bool DocSplitter::finish(TextDoc* doc) {
  if (para_.text.empty()) return false;
  *doc = std::move(para_);
  para_ = TextDoc();
  return true;
}

std::string DocSplitter::jsonl_text(std::string_view line) const {
  const std::string where = name_ + ":" + std::to_string(line_no_);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(line);
  } catch (const nlohmann::json::exception& e) {  // also out_of_range: 1e999 (found by tests/fuzz)
    throw DataError(where + ": invalid JSON (" + e.what() + ")");
  }
  if (!j.is_object()) throw DataError(where + ": JSONL record is not an object");
  auto it = j.find(field_);
  if (it == j.end()) throw DataError(where + ": record has no \"" + field_ + "\" field (--text-field)");
  if (!it->is_string()) throw DataError(where + ": field \"" + field_ + "\" is not a string");
  return it->get<std::string>();
}

void for_each_line(const std::string& path, uint64_t from, uint64_t to, const std::vector<ZstdFrame>& frames,
                   const std::function<void(std::string_view, uint64_t, uint64_t)>& fn, std::vector<ZstdFrame>* found) {
  std::string carry;  // the line so far
  uint64_t at = from, pos = from;  // where `carry` starts; the next byte's offset
  const Emit cut = [&](const char* p, size_t n) {
    const char* const end = p + n;
    while (p < end) {
      const char* nl = static_cast<const char*>(std::memchr(p, '\n', static_cast<size_t>(end - p)));
      if (!nl) {
        carry.append(p, static_cast<size_t>(end - p));
        pos += static_cast<uint64_t>(end - p);
        return;
      }
      const size_t k = static_cast<size_t>(nl - p);
      pos += k + 1;
      if (carry.empty()) {
        fn(std::string_view(p, k), at, pos);
      } else {
        carry.append(p, k);
        fn(carry, at, pos);
        carry.clear();
      }
      at = pos, p = nl + 1;
    }
  };
  if (is_zstd(path)) read_zstd(path, from, to, frames, cut, found);
  else read_plain(path, from, to, cut);
  if (!carry.empty()) fn(carry, at, pos);
}

std::vector<std::string> list_text_files(const std::string& path) {
  namespace stdfs = std::filesystem;
  std::error_code ec;
  const auto st = stdfs::status(path, ec);
  if (!stdfs::exists(st)) throw DataError(path + ": no such file or directory");
  if (!stdfs::is_directory(st)) return {path};
  std::vector<std::string> files;
  try {
    for (const auto& e : stdfs::recursive_directory_iterator(path)) {
      const std::string p = e.path().string();
      if (e.is_regular_file() && !(p.size() > 6 && p.compare(p.size() - 6, 6, ".lmidx") == 0)) files.push_back(p);
    }
  } catch (const stdfs::filesystem_error& e) {
    throw DataError(path + ": cannot list directory (" + e.code().message() + ")");
  }
  std::sort(files.begin(), files.end());
  return files;
}

std::string read_text_file(const std::string& path) {
  std::string out;
  const Emit add = [&](const char* p, size_t n) { out.append(p, n); };
  if (is_zstd(path)) read_zstd(path, 0, std::numeric_limits<uint64_t>::max(), {}, add, nullptr);
  else read_plain(path, 0, std::numeric_limits<uint64_t>::max(), add);
  return out;
}

}  // namespace lm::data
