// Fuzzes safetensors files as checkpoints read them (trainer/checkpoint/safetensors.h
// load_safetensors): the 8-byte header length, the JSON header (dtypes, shapes, data_offsets,
// __metadata__) and the data section. Contract: a CheckpointError naming the file, or tensors whose
// bytes all came from the file; never an allocation the file's size does not back.
#include "tests/fuzz/fuzz_util.h"
#include "trainer/checkpoint/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace lm;
  const std::string path = fuzz::put_file("t.safetensors", std::string(reinterpret_cast<const char*>(data), size));
  fuzz::expect_typed([&] {
    std::map<std::string, std::string> meta;
    auto tensors = load_safetensors(path, &meta);
    uint64_t bytes = 0;
    for (auto& [name, t] : tensors) bytes += t.numel() * t.element_size();
    if (bytes > size) {
      std::fprintf(stderr, "FUZZ FINDING: %llu tensor bytes from a %zu-byte file\n", (unsigned long long)bytes, size);
      std::abort();
    }
  });
  return 0;
}
