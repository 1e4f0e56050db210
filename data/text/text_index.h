// The index of one raw text file: where each document starts and ends, its token count and split,
// and the file's chunks (the loader's shards: runs of whole documents of one split). Built once,
// by `prep index FILE...` (PATH.lmidx next to the file) or by the loader on first open (in
// data.cache_dir), and used while the file's size and modification time are those it was built on.
// Each chunk's checksum covers the texts of its documents: the loader checks it whenever it
// tokenizes the chunk, so a file edited in place is named, never read as other documents.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "data/text/documents.h"

namespace lm::data {

class Tokenizer;

// How raw text becomes documents, tokens and splits: prep's rules and options (prep.h).
struct TextOptions {
  std::string docs = "line";         // one document per: line | paragraph | jsonl record
  std::string text_field = "text";   // jsonl: the field holding the text
  double val_fraction = 0.01;        // share of documents in the val split (prep's is_val_document)
  uint64_t split_seed = 0;
  uint64_t chunk_tokens = 1 << 20;   // tokens per chunk (documents are never split)
};

struct TextDocEntry {
  uint64_t begin = 0, end = 0;  // bytes of the (decompressed) text, as TextDoc
  uint32_t tokens = 0;
  bool val = false;
};

struct TextChunk {
  bool val = false;               // its split
  uint64_t first_doc = 0;         // index in TextIndex::docs of its first document
  uint64_t last_doc = 0;          // ... and of its last one (documents of the other split may lie between)
  uint64_t docs = 0, tokens = 0;  // of its split only
  uint64_t xxh64 = 0;             // xxh64 over the xxh64s of its documents' texts
};

struct TextIndex {
  std::string path;                  // the text file
  std::string key;                   // index_key() of what it was built with
  uint64_t file_size = 0;
  int64_t mtime_ns = 0;
  std::vector<TextDocEntry> docs;
  std::vector<ZstdFrame> frames;     // zstd files: where frames start (decoding starts there)
  std::vector<TextChunk> chunks;

  // Reads the file once: documents cut by o.docs, tokenized on `threads` threads (token counts
  // only), split and chunked. Throws DataError naming FILE:LINE for bad input.
  static TextIndex build(const std::string& path, const TextOptions& o, const Tokenizer& tok, int threads);
  // Writes the index to `file` (temp-then-rename, with a checksum).
  void save(const std::string& file) const;
  // The index in `file` when it is intact, was built with `key` and the text file at `path` still
  // has the size and modification time it was built on; nullopt otherwise (missing, stale, damaged).
  static std::optional<TextIndex> load(const std::string& file, const std::string& path, const std::string& key);
};

// What an index depends on besides the file: the options and the tokenizer (its hash).
std::string index_key(const TextOptions& o, const std::string& tokenizer_hash);

// The xxh64 of one document's text (TextChunk::xxh64 is the xxh64 of these, in order).
uint64_t doc_text_hash(const std::string& text);

// The index of `path`: PATH.lmidx when current, else CACHE_DIR/text-index/<key of the path>.lmidx
// when current, else built now and saved there. `built` (optional) says whether it was built.
TextIndex text_index(const std::string& path, const TextOptions& o, const Tokenizer& tok, const std::string& cache_dir,
                     int threads, bool* built = nullptr);

}  // namespace lm::data
