// Fuzzes the raw-text reader (data/text/): the input is a text file (a zstd stream when it starts
// with zstd's magic number), cut into documents by line, paragraph or jsonl (the input's size
// mod 3). The index is built (bytes tokenizer, chunks of 64 tokens), saved and loaded back, and
// every chunk is read again from its own byte range, as the loader does. Contract: a DataError
// (exit 2), or an index whose chunks read back to exactly their documents; anything else aborts.
#include <cstdio>
#include <cstdlib>
#include <limits>

#include "common/checksum.h"
#include "data/text/documents.h"
#include "data/text/text_index.h"
#include "data/tokenizer/tokenizer.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

void check(bool ok, const char* what) {
  if (ok) return;
  std::fprintf(stderr, "FUZZ FINDING: %s\n", what);
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace lm;
  using namespace lm::data;
  static const auto tok = make_bytes_tokenizer();
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  const bool zst = bytes.compare(0, 4, "\x28\xb5\x2f\xfd") == 0;
  const std::string path = fuzz::put_file(zst ? "in.zst" : "in.txt", bytes);
  TextOptions o;
  o.docs = size % 3 == 0 ? "line" : size % 3 == 1 ? "paragraph" : "jsonl";
  o.val_fraction = 0.3;
  o.chunk_tokens = 64;
  fuzz::expect_typed([&] {
    const TextIndex ix = TextIndex::build(path, o, *tok, 1);
    ix.save(fuzz::scratch_dir() + "/in.lmidx");
    const auto back = TextIndex::load(fuzz::scratch_dir() + "/in.lmidx", path, ix.key);
    check(back && back->docs.size() == ix.docs.size() && back->chunks.size() == ix.chunks.size(), "index round trip");
    for (const auto& c : ix.chunks) {
      DocSplitter split(o.docs, o.text_field, path);
      TextDoc d;
      std::vector<uint64_t> hashes;
      auto add = [&] {
        if (is_val_document(d.text, o.split_seed, o.val_fraction) == c.val) hashes.push_back(doc_text_hash(d.text));
      };
      for_each_line(path, ix.docs[c.first_doc].begin, ix.docs[c.last_doc].end, ix.frames,
                    [&](std::string_view line, uint64_t at, uint64_t end) {
                      if (split.line(line, at, end, &d)) add();
                    });
      if (split.finish(&d)) add();
      check(hashes.size() == c.docs && xxh64(hashes.data(), hashes.size() * 8) == c.xxh64,
            "a chunk read from its byte range differs from the index");
    }
  });
  return 0;
}
