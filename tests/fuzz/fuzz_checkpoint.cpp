// Fuzzes a checkpoint directory as resume reads it (trainer/checkpoint/reader.h
// CheckpointReader::verify and ::load): manifest.json, state.json, rank_0.json, model.safetensors.
// Input: those four files' bytes separated by lines "#@file"; a manifest of exactly "auto" is
// replaced by a valid one listing the other files with their true sizes and checksums, so the
// fuzzer also reaches the state parsing behind the checksum gate. Contract: a CheckpointError, or a
// state whose pieces were all listed.
#include "common/checksum.h"
#include "tests/fuzz/fuzz_util.h"
#include "trainer/checkpoint/layout.h"
#include "trainer/checkpoint/reader.h"

#include <nlohmann/json.hpp>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace lm;
  static const std::string run = fuzz::scratch_dir() + "/run";
  static const std::string dir = run + "/checkpoints/step_00000001";
  static const bool made = (files::make_dirs(dir), true);
  (void)made;
  std::string rest(reinterpret_cast<const char*>(data), size), manifest;
  std::tie(manifest, rest) = fuzz::split_at(rest, "\n#@file\n");
  nlohmann::json listed = nlohmann::json::array();
  for (const char* name : {"state.json", "rank_0.json", "model.safetensors"}) {
    std::string bytes;
    std::tie(bytes, rest) = fuzz::split_at(rest, "\n#@file\n");
    fuzz::put_file(std::string("run/checkpoints/step_00000001/") + name, bytes);
    listed.push_back({{"name", name}, {"bytes", bytes.size()}, {"xxh64", hex64(xxh64(bytes.data(), bytes.size()))}});
  }
  if (manifest == "auto")
    manifest = nlohmann::json{{"magic", kCheckpointMagic}, {"version", kCheckpointVersion}, {"files", listed}}.dump();
  fuzz::put_file("run/checkpoints/step_00000001/manifest.json", manifest);
  CheckpointConfig cfg;
  CheckpointReader ck(cfg, run, 0);
  (void)CheckpointReader::verify(dir);
  fuzz::expect_typed([&] { (void)ck.load(dir); });
  return 0;
}
