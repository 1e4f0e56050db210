// Hostile data input, as a new user (or a bad disk) would give it (hostile config files:
// tests/run/config/config_test.cpp): prep options out of range and the leftovers of a killed prep; token ids past the vocabulary; and random byte flips and truncations
// in every file of a dataset. Each is refused with one line naming the file (exit 2), never a
// crash, and never a batch built from wrong tokens.
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <random>

#include "common/checksum.h"
#include "common/errors.h"
#include "common/files.h"
#include "data/format/manifest.h"
#include "data/format/shard.h"
#include "data/loader/loader.h"
#include "data/loader/val_reader.h"
#include "tests/testutil.h"

namespace lm {
namespace {

namespace stdfs = std::filesystem;
using test::TempDir;

// A prep killed mid-way leaves OUT.tmp.<pid>; the next prep removes it when that process is gone
// (and leaves one whose process still runs).
TEST(HostilePrep, StaleTempDirsOfDeadProcessesAreCleaned) {
  TempDir tmp;
  test::Proc dead = test::spawn_bin("/bin/true", {}, tmp / "true.log");
  const pid_t gone = dead.process.pid();
  test::wait_proc(dead);
  const std::string stale = tmp / ("out.tmp." + std::to_string(gone)), live = tmp / ("out.tmp." + std::to_string(::getpid()));
  for (auto& d : {stale, live}) {
    stdfs::create_directories(d);
    test::write_text(d + "/train_000000.bin", "partial");
  }
  test::write_text(tmp / "in.txt", test::synthetic_corpus(50));
  auto r = test::run_bin("prep", {tmp / "in.txt", "--out", tmp / "out", "--tokenizer", "bytes", "--quiet"});
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_FALSE(stdfs::exists(stale)) << "a dead prep's temp dir was left";
  EXPECT_TRUE(stdfs::exists(live)) << "a live process's temp dir was removed";
  EXPECT_TRUE(stdfs::exists(tmp / "out/manifest.json"));
}

// ---- data ----------------------------------------------------------------------------------------

DataConfig data_config(const std::string& verify) {
  DataConfig c;
  c.workers = 1;
  c.prefetch = 2;
  c.verify = verify;
  return c;
}

// Reads one epoch of the train split and the whole val split (what a trainer would use).
void read_everything(const std::string& dir, const std::string& verify) {
  const auto m = data::Manifest::load(dir);
  data::Loader loader(test::train_form(data_config(verify), m.dir), {m}, "train", 16, 4, 0, 1, 7);
  for (int64_t i = 0; i < loader.samples_per_epoch() / 4 + 1; ++i) loader.next();
  data::ValReader val(m, "val", 16, verify == "full");
  std::vector<int64_t> buf;
  for (int i = 0; i < 60; ++i) val.next(4, buf);
}

// A shard whose token id is past the vocabulary but whose checksums were made to match (a
// hand-edited shard): refused as the batch is built, naming shard, document and id.
TEST(HostileData, TokenIdsPastTheVocabularyNameShardAndDocument) {
  for (const std::string split : {"train", "val"}) {
    TempDir tmp;
    stdfs::copy(test::make_bytes_dataset(tmp.path(), 200), tmp / "d", stdfs::copy_options::recursive);
    auto m = data::Manifest::load(tmp / "d");
    auto& shard = *std::find_if(m.shards.begin(), m.shards.end(), [&](auto& s) { return s.split == split; });
    const std::string path = tmp / ("d/" + shard.file);
    std::string bytes = test::read_text(path);
    data::ShardReader r(path);
    const uint64_t at = 64 + 8 * (r.num_docs() + 1) + 2 * r.doc_offset(1);  // document 1's first token
    bytes[at] = static_cast<char>(0x39), bytes[at + 1] = static_cast<char>(0x30);  // id 0x3039 = 12345
    test::write_text(path, bytes);
    shard.xxh64 = hex64(xxh64(bytes.data(), bytes.size()));
    m.data_version = data::compute_data_version(m.shards, m.tokenizer.hash);
    test::write_text(tmp / "d/manifest.json", m.to_json());
    const std::string e = test::data_error([&] { read_everything(tmp / "d", "full"); });
    EXPECT_NE(e.find(path + ": document 1: token id 12345"), std::string::npos) << e;
    EXPECT_NE(e.find("vocabulary size 258"), std::string::npos) << e;
  }
}

// A flipped byte in a val shard: caught before its tokens are used (lazy) or at start (full).
TEST(HostileData, ValidationShardsAreVerified) {
  for (const std::string verify : {"lazy", "full"}) {
    TempDir tmp;
    const std::string dir = test::make_bytes_dataset(tmp.path(), 200);
    auto m = data::Manifest::load(dir);
    const auto val = m.split("val");
    ASSERT_FALSE(val.empty());
    const std::string path = dir + "/" + val[0].file;
    std::string bytes = test::read_text(path);
    bytes[bytes.size() - 3] ^= 0x01;  // a token, not the header: only the checksum can tell
    test::write_text(path, bytes);
    const std::string e = test::data_error([&] { read_everything(dir, verify); });
    EXPECT_NE(e.find(path + ": checksum"), std::string::npos) << verify << ": " << e;
  }
}

// Random byte flips and truncations in every file of a dataset (shards, their headers, the
// manifest): every case refused with a DataError naming the damaged file, under lazy and full
// verification; nothing else is thrown and nothing is read past a damaged part unchecked.
TEST(HostileData, RandomCorruptionOfAnyDatasetFileIsNamed) {
  TempDir tmp;
  const std::string clean = test::make_bytes_dataset(tmp.path(), 300);
  std::vector<std::string> names;
  for (auto& e : stdfs::directory_iterator(clean)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  std::mt19937 g(20261201);
  int cases = 0;
  for (int round = 0; round < 6; ++round) {
    for (const auto& name : names) {
      for (const bool truncate : {false, true}) {
        const std::string dir = tmp / ("c" + std::to_string(cases++));
        stdfs::copy(clean, dir, stdfs::copy_options::recursive);
        const std::string path = dir + "/" + name;
        std::string bytes = test::read_text(path);
        // Headers get extra attention: half of the flips land in the first 64 + 16 bytes.
        const size_t span = (g() % 2 == 0 && bytes.size() > 80) ? 80 : bytes.size();
        const size_t at = g() % span;
        if (truncate)
          bytes.resize(at);
        else
          bytes[at] = static_cast<char>(bytes[at] ^ (1u << (g() % 8)));
        test::write_text(path, bytes);
        const std::string verify = cases % 2 ? "lazy" : "full";
        try {
          read_everything(dir, verify);
          ADD_FAILURE() << "not detected: " << name << (truncate ? " truncated at " : " flipped at ") << at;
        } catch (const DataError& e) {
          // A damaged manifest may be noticed at a shard it now describes wrongly: "... manifest.json".
          EXPECT_NE(std::string(e.what()).find(name == "manifest.json" ? name : path), std::string::npos)
              << name << (truncate ? " truncated at " : " flipped at ") << at << ": " << e.what();
        }
      }
    }
  }
  EXPECT_GE(cases, 30);
}

}  // namespace
}  // namespace lm
