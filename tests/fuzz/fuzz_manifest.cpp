// Fuzzes a dataset's manifest.json (data/format/manifest.h Manifest::load) and what the loader does
// with a loaded manifest before touching shards: splits, token sums, the JSON written back.
// Contract: a DataError naming the file, or a manifest whose to_json() loads back to the same.
#include "data/format/manifest.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace lm;
  const std::string dir = fuzz::scratch_dir() + "/ds";
  static const bool made = (files::make_dirs(dir), true);
  (void)made;
  fuzz::put_file("ds/manifest.json", std::string(reinterpret_cast<const char*>(data), size));
  fuzz::expect_typed([&] {
    auto m = data::Manifest::load(dir);
    for (const char* split : {"train", "val"}) {
      (void)m.split(split);
      (void)m.split_tokens(split);
    }
    const std::string once = m.to_json();
    fuzz::put_file("ds/manifest.json", once);
    if (data::Manifest::load(dir).to_json() != once) {
      std::fprintf(stderr, "FUZZ FINDING: manifest round trip differs\n");
      std::abort();
    }
  });
  return 0;
}
