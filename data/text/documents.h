// Raw text as documents: THE rules that cut text into documents (prep and the raw-text loader both
// use them, so both see the same documents), and the reading of plain or zstd-compressed files,
// whole or from any byte of their text.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace lm::data {

// Only spaces, tabs, '\r' and '\n': such a line separates documents or is skipped, never one.
bool is_blank(std::string_view s);

// The split of a document: "val" iff xxh64(text, seed) / 2^64 < val_fraction (53-bit precision).
bool is_val_document(const std::string& text, uint64_t seed, double val_fraction);

struct TextDoc {
  std::string text;
  uint64_t begin = 0, end = 0;  // its lines in the (decompressed) input: bytes [begin, end), newlines included
  uint64_t line = 0;            // its first line, 1-based
};

// Cuts lines into documents: "line" (each non-blank line), "paragraph" (non-blank lines up to a
// blank one, joined by '\n') or "jsonl" (the string field `text_field` of each non-blank line's
// object; a blank text is skipped). A trailing '\r' is dropped from every line. Throws DataError
// naming NAME:LINE for a bad JSONL record.
class DocSplitter {
 public:
  DocSplitter(std::string docs, std::string text_field, std::string name, uint64_t first_line = 1);
  // The next line, without its '\n', at bytes [at, end) of the input (end: after its '\n', if
  // any). True when it completes a document (*doc).
  bool line(std::string_view line, uint64_t at, uint64_t end, TextDoc* doc);
  // The end of the input: true when it completes a document.
  bool finish(TextDoc* doc);

 private:
  std::string jsonl_text(std::string_view line) const;
  std::string docs_, field_, name_;
  uint64_t line_no_;
  TextDoc para_;  // paragraph mode: the document being gathered
};

// A zstd frame's start: its offset in the compressed file and in the text.
struct ZstdFrame {
  uint64_t packed = 0, plain = 0;
};

// True for names ending in ".zst" (read through zstd).
bool is_zstd(const std::string& path);

// The lines of text file `path` (decompressed) that start in [from, to) (to = UINT64_MAX: the
// end), in order: fn(line without '\n', at, end) as DocSplitter::line() takes them. `from` must
// be the start of a line. zstd: decoding starts at the last of `frames` at or before `from`; when
// `found` is given, the frame starts met are appended to it. Throws DataError naming the file.
void for_each_line(const std::string& path, uint64_t from, uint64_t to, const std::vector<ZstdFrame>& frames,
                   const std::function<void(std::string_view, uint64_t, uint64_t)>& fn,
                   std::vector<ZstdFrame>* found = nullptr);

// The text files at `path`: the file itself, or a directory's regular files (recursively, in path
// order) except index files (*.lmidx, text_index.h). Throws DataError naming the path.
std::vector<std::string> list_text_files(const std::string& path);

// The whole text of a file, decompressed when it is zstd (prep's .zst inputs).
std::string read_text_file(const std::string& path);

}  // namespace lm::data
