// Fuzzes the shard file (data/format/shard.h ShardReader: header, document index, tokens) as the
// loader reads it: open, then every document's offsets and tokens.
// Contract: a DataError naming the file on open, or a shard whose every document reads in bounds.
#include "data/format/shard.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace lm;
  const std::string path = fuzz::put_file("shard.bin", std::string(reinterpret_cast<const char*>(data), size));
  fuzz::expect_typed([&] {
    data::ShardReader r(path);
    uint64_t total = 0;
    for (uint64_t i = 0; i < r.num_docs(); ++i) total += r.read_doc(i).size();
    if (total != r.num_tokens()) {
      std::fprintf(stderr, "FUZZ FINDING: documents hold %llu tokens, header says %llu\n",
                   (unsigned long long)total, (unsigned long long)r.num_tokens());
      std::abort();
    }
  });
  return 0;
}
