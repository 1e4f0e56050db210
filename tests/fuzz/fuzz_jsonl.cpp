// Fuzzes prep's JSONL reader end to end (data/prep/prep.h run_prep with docs: jsonl, the bytes
// tokenizer, one thread): the input is the .jsonl file. Contract: a DataError naming FILE:LINE, or
// a dataset directory.
#include "data/prep/prep.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace lm;
  data::PrepOptions o;
  o.inputs = {fuzz::put_file("in.jsonl", std::string(reinterpret_cast<const char*>(data), size))};
  o.out = fuzz::scratch_dir() + "/prepped";
  o.docs = "jsonl";
  o.threads = 1;
  o.quiet = true;
  o.val_fraction = 0.5;
  fuzz::expect_typed([&] { (void)data::run_prep(o); });
  return 0;
}
