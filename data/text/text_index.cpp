// Building, saving and loading the index of a raw text file (see text_index.h).
#include "data/text/text_index.h"

#include <sys/stat.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <limits>

#include "common/checksum.h"
#include "common/errors.h"
#include "common/files.h"
#include "common/log.h"
#include "common/parallel.h"
#include "data/tokenizer/tokenizer.h"

namespace lm::data {
namespace {

constexpr char kMagic[8] = {'L', 'M', 'T', 'X', 'T', 'I', 'X', '1'};
constexpr size_t kBatchBytes = 1 << 20;  // text per tokenizing work item

struct FileStamp {
  uint64_t size = 0;
  int64_t mtime_ns = 0;
};

FileStamp stamp_of(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) throw DataError(path + ": cannot stat (" + std::strerror(errno) + ")");
  return {static_cast<uint64_t>(st.st_size), static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec};
}

// Documents read but not yet tokenized: one tokenizing work item (not the loader's training Batch).
struct DocBatch {
  std::vector<TextDoc> docs;
  std::vector<uint32_t> tokens;
  std::vector<char> val;
  std::vector<uint64_t> hash;
  size_t bytes = 0;
};

// Runs of documents of one split, each closed before it would pass o.chunk_tokens.
std::vector<TextChunk> chunk(const std::vector<TextDocEntry>& docs, const std::vector<uint64_t>& hashes,
                             uint64_t chunk_tokens) {
  std::vector<TextChunk> out;
  for (bool val : {false, true}) {
    TextChunk c;
    c.val = val;
    std::vector<uint64_t> h;
    auto close = [&] {
      if (c.docs == 0) return;
      c.xxh64 = xxh64(h.data(), h.size() * sizeof(uint64_t));
      out.push_back(c);
      c = TextChunk{}, c.val = val, h.clear();
    };
    for (uint64_t i = 0; i < docs.size(); ++i) {
      if (docs[i].val != val) continue;
      if (c.docs > 0 && c.tokens + docs[i].tokens + 1 > chunk_tokens) close();
      if (c.docs == 0) c.first_doc = i;
      c.last_doc = i;
      ++c.docs, c.tokens += docs[i].tokens;
      h.push_back(hashes[i]);
    }
    close();
  }
  return out;
}

void put(std::string& out, uint64_t v) { out.append(reinterpret_cast<const char*>(&v), sizeof v); }

struct Cursor {
  const std::string& bytes;
  size_t at = 0;
  bool ok = true;
  uint64_t get() {
    uint64_t v = 0;
    if (at + sizeof v > bytes.size()) return ok = false, 0;
    std::memcpy(&v, bytes.data() + at, sizeof v);
    at += sizeof v;
    return v;
  }
};

}  // namespace

uint64_t doc_text_hash(const std::string& text) { return xxh64(text.data(), text.size()); }

std::string index_key(const TextOptions& o, const std::string& tokenizer_hash) {
  const std::string s = strf("docs=%s field=%s val=%.17g seed=%llu chunk=%llu tokenizer=%s", o.docs.c_str(),
                             o.docs == "jsonl" ? o.text_field.c_str() : "", o.val_fraction, static_cast<unsigned long long>(o.split_seed),
                             static_cast<unsigned long long>(o.chunk_tokens), tokenizer_hash.c_str());
  return hex64(xxh64(s.data(), s.size()));
}

TextIndex TextIndex::build(const std::string& path, const TextOptions& o, const Tokenizer& tok, int threads) {
  TextIndex ix;
  ix.path = path;
  ix.key = index_key(o, tok.info().hash);
  const FileStamp st = stamp_of(path);
  ix.file_size = st.size, ix.mtime_ns = st.mtime_ns;
  std::vector<uint64_t> hashes;
  std::vector<DocBatch> round;
  auto flush = [&] {  // tokenizes a round of batches in parallel, appends them in reading order
    parallel_for(round.size(), threads, [&](size_t i) {
      for (const auto& d : round[i].docs) {
        const size_t n = tok.encode(d.text).size();
        if (n > std::numeric_limits<uint32_t>::max()) throw DataError(strf("%s:%llu: a document of more than 2^32 tokens",
                                                                           path.c_str(), static_cast<unsigned long long>(d.line)));
        round[i].tokens.push_back(static_cast<uint32_t>(n));
        round[i].val.push_back(is_val_document(d.text, o.split_seed, o.val_fraction));
        round[i].hash.push_back(doc_text_hash(d.text));
      }
    });
    for (const auto& b : round)
      for (size_t k = 0; k < b.docs.size(); ++k) {
        ix.docs.push_back({b.docs[k].begin, b.docs[k].end, b.tokens[k], b.val[k] != 0});
        hashes.push_back(b.hash[k]);
      }
    round.clear();
  };
  auto add = [&](TextDoc& d) {
    if (round.empty() || round.back().bytes >= kBatchBytes) {
      if (round.size() >= static_cast<size_t>(4 * std::max(threads, 1))) flush();
      round.emplace_back();
    }
    round.back().bytes += d.text.size();
    round.back().docs.push_back(std::move(d));
  };
  DocSplitter split(o.docs, o.text_field, path);
  TextDoc d;
  for_each_line(path, 0, std::numeric_limits<uint64_t>::max(), {}, [&](std::string_view line, uint64_t at, uint64_t end) {
    if (split.line(line, at, end, &d)) add(d);
  }, &ix.frames);
  if (split.finish(&d)) add(d);
  flush();
  ix.chunks = chunk(ix.docs, hashes, o.chunk_tokens);
  return ix;
}

void TextIndex::save(const std::string& file) const {
  std::string out(kMagic, sizeof kMagic);
  out += key;
  for (uint64_t v : {file_size, static_cast<uint64_t>(mtime_ns), uint64_t{docs.size()}, uint64_t{frames.size()},
                     uint64_t{chunks.size()}})
    put(out, v);
  for (const auto& d : docs) put(out, d.begin), put(out, d.end), put(out, d.tokens | (uint64_t{d.val} << 63));
  for (const auto& f : frames) put(out, f.packed), put(out, f.plain);
  for (const auto& c : chunks)
    put(out, c.val), put(out, c.first_doc), put(out, c.last_doc), put(out, c.docs), put(out, c.tokens), put(out, c.xxh64);
  put(out, xxh64(out.data(), out.size()));
  files::write_file_atomic(file, out);
}

std::optional<TextIndex> TextIndex::load(const std::string& file, const std::string& path, const std::string& key) {
  if (!files::exists(file)) return std::nullopt;
  const std::string bytes = files::read_file(file);
  const size_t head = sizeof kMagic + key.size();
  uint64_t sum = 0;
  if (bytes.size() < head + 8 || std::memcmp(bytes.data(), kMagic, sizeof kMagic) != 0 ||
      (std::memcpy(&sum, bytes.data() + bytes.size() - 8, 8), sum != xxh64(bytes.data(), bytes.size() - 8))) {
    log::warn(file + ": not an intact text index: rebuilding it");
    return std::nullopt;
  }
  if (bytes.compare(sizeof kMagic, key.size(), key) != 0) return std::nullopt;  // other options or tokenizer
  TextIndex ix;
  ix.path = path, ix.key = key;
  Cursor c{bytes, head};
  ix.file_size = c.get(), ix.mtime_ns = static_cast<int64_t>(c.get());
  const uint64_t nd = c.get(), nf = c.get(), nc = c.get();
  if (!c.ok || (nd * 3 + nf * 2 + nc * 6 + 1) * 8 != bytes.size() - c.at) return std::nullopt;
  const FileStamp st = stamp_of(path);
  if (st.size != ix.file_size || st.mtime_ns != ix.mtime_ns) return std::nullopt;  // the text changed since
  for (uint64_t i = 0; i < nd; ++i) {
    TextDocEntry d;
    d.begin = c.get(), d.end = c.get();
    const uint64_t t = c.get();
    d.tokens = static_cast<uint32_t>(t), d.val = (t >> 63) != 0;
    ix.docs.push_back(d);
  }
  for (uint64_t i = 0; i < nf; ++i) ix.frames.push_back({c.get(), c.get()});
  for (uint64_t i = 0; i < nc; ++i) {
    TextChunk k;
    k.val = c.get() != 0, k.first_doc = c.get(), k.last_doc = c.get(), k.docs = c.get(), k.tokens = c.get(), k.xxh64 = c.get();
    if (k.first_doc > k.last_doc || k.last_doc >= nd) return std::nullopt;
    ix.chunks.push_back(k);
  }
  return ix;
}

TextIndex text_index(const std::string& path, const TextOptions& o, const Tokenizer& tok, const std::string& cache_dir,
                     int threads, bool* built) {
  const std::string key = index_key(o, tok.info().hash);
  if (built) *built = false;
  if (auto ix = TextIndex::load(path + ".lmidx", path, key)) return *ix;
  std::error_code ec;
  const std::string abs = std::filesystem::absolute(path, ec).lexically_normal().string();
  const std::string name = hex64(xxh64(abs.data(), abs.size(), 1)) + "-" + key + ".lmidx";
  const std::string cached = cache_dir + "/text-index/" + name;
  if (auto ix = TextIndex::load(cached, path, key)) return *ix;
  const auto t0 = std::chrono::steady_clock::now();
  TextIndex ix = TextIndex::build(path, o, tok, threads);
  files::make_dirs(cache_dir + "/text-index");
  ix.save(cached);
  log::info(strf("text index: %s: %zu documents, %zu chunks, built in %.1f s (%s)", path.c_str(), ix.docs.size(),
                 ix.chunks.size(), std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(),
                 cached.c_str()));
  if (built) *built = true;
  return ix;
}

}  // namespace lm::data
