// Copies of a prepared dataset changed in one way, for the refusal tests of the trainer's suites.
#pragma once

#include <string>

#include "common/checksum.h"
#include "common/files.h"
#include "data/format/manifest.h"
#include "tests/testutil.h"

namespace lm::test {

// A copy of `src` (a prepared dataset) in `dir` whose manifest claims another tokenizer (so another
// data version); the shards are the same bytes.
inline std::string other_tokenizer_copy(const std::string& src, const std::string& dir) {
  files::make_dirs(dir);
  data::Manifest m = data::Manifest::load(src);
  for (const auto& s : m.shards) write_text(dir + "/" + s.file, read_text(src + "/" + s.file));
  m.tokenizer.hash = hex64(xxh64("other", 5));
  m.data_version = data::compute_data_version(m.shards, m.tokenizer.hash);
  files::write_file_atomic(dir + "/manifest.json", m.to_json());
  return dir;
}

}  // namespace lm::test
