// Shard round trips and corruption, manifest validation, and ValReader windows across shard
// and epoch boundaries, on tiny synthetic shards.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "data/format/manifest.h"
#include "data/loader/val_reader.h"
#include "data/format/shard.h"
#include "tests/testutil.h"
#include "common/errors.h"
#include "common/checksum.h"
#include "common/files.h"

namespace lm::data {
namespace {

using Docs = std::vector<std::vector<uint32_t>>;
using test::data_error;
using test::TempDir;

uint64_t write_shard(const std::string& path, TokenDtype dtype, const Docs& docs) {
  ShardWriter w(path, dtype);
  for (const auto& d : docs) w.add_document(d.data(), d.size());
  return w.finish();
}

void expect_reads_back(const std::string& path, TokenDtype dtype, const Docs& docs) {
  ShardReader r(path);
  EXPECT_EQ(r.dtype(), dtype);
  ASSERT_EQ(r.num_docs(), docs.size());
  uint64_t off = 0;
  std::vector<uint32_t> all;
  for (size_t i = 0; i < docs.size(); ++i) {
    EXPECT_EQ(r.doc_offset(i), off);
    EXPECT_EQ(r.doc_length(i), docs[i].size());
    EXPECT_EQ(r.read_doc(i), docs[i]);
    off += docs[i].size();
    all.insert(all.end(), docs[i].begin(), docs[i].end());
  }
  EXPECT_EQ(r.doc_offset(docs.size()), off);
  EXPECT_EQ(r.num_tokens(), off);
  std::vector<uint32_t> got(all.size());
  r.read_tokens(0, got.size(), got.data());
  EXPECT_EQ(got, all);
}

// Overwrites `n` bytes at `offset` of a file.
void patch(const std::string& path, long offset, const std::string& bytes) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(offset);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

TEST(ShardTest, RoundTripUint16WithEmptyDocs) {
  TempDir tmp;
  Docs docs = {{1, 2, 3}, {}, {65535}, {7, 8}, {}};
  uint64_t h = write_shard(tmp / "s.bin", TokenDtype::kU16, docs);
  EXPECT_EQ(h, xxh64_file(tmp / "s.bin"));
  EXPECT_EQ(std::filesystem::file_size(tmp / "s.bin"), 64u + 8 * 6 + 2 * 6);
  expect_reads_back(tmp / "s.bin", TokenDtype::kU16, docs);
  ShardReader r(tmp / "s.bin");
  std::vector<uint32_t> mid(3);
  r.read_tokens(2, 3, mid.data());
  EXPECT_EQ(mid, (std::vector<uint32_t>{3, 65535, 7}));
}

TEST(ShardTest, RoundTripUint32) {
  TempDir tmp;
  Docs docs = {{70000, 0, 4000000000u}, {65536}};
  write_shard(tmp / "s.bin", TokenDtype::kU32, docs);
  EXPECT_EQ(std::filesystem::file_size(tmp / "s.bin"), 64u + 8 * 3 + 4 * 4);
  expect_reads_back(tmp / "s.bin", TokenDtype::kU32, docs);
}

TEST(ShardTest, EmptyShard) {
  TempDir tmp;
  write_shard(tmp / "s.bin", TokenDtype::kU16, {});
  expect_reads_back(tmp / "s.bin", TokenDtype::kU16, {});
}

TEST(ShardTest, DtypeForVocab) {
  EXPECT_EQ(dtype_for_vocab(258), TokenDtype::kU16);
  EXPECT_EQ(dtype_for_vocab(65536), TokenDtype::kU16);
  EXPECT_EQ(dtype_for_vocab(65537), TokenDtype::kU32);
}

TEST(ShardTest, IdTooLargeForUint16Throws) {
  TempDir tmp;
  ShardWriter w(tmp / "s.bin", TokenDtype::kU16);
  uint32_t id = 65536;
  EXPECT_THROW(w.add_document(&id, 1), Error);
}

TEST(ShardTest, UnfinishedWriterLeavesNothing) {
  TempDir tmp;
  {
    ShardWriter w(tmp / "s.bin", TokenDtype::kU16);
    uint32_t id = 5;
    w.add_document(&id, 1);
  }
  EXPECT_TRUE(std::filesystem::is_empty(tmp.path()));
}

TEST(ShardTest, CorruptOrTruncatedShardIsDataError) {
  TempDir tmp;
  const std::string p = tmp / "s.bin";
  Docs docs = {{1, 2, 3}, {4}};

  write_shard(p, TokenDtype::kU16, docs);
  patch(p, 0, "XX");
  EXPECT_NE(data_error([&] { ShardReader r(p); }).find(p + ": not a token shard (bad magic)"), std::string::npos);

  write_shard(p, TokenDtype::kU16, docs);
  patch(p, 8, std::string("\x07\0\0\0", 4));
  EXPECT_NE(data_error([&] { ShardReader r(p); }).find("version 7"), std::string::npos);

  write_shard(p, TokenDtype::kU16, docs);
  std::filesystem::resize_file(p, std::filesystem::file_size(p) - 1);
  EXPECT_NE(data_error([&] { ShardReader r(p); }).find("truncated"), std::string::npos);

  write_shard(p, TokenDtype::kU16, docs);
  std::filesystem::resize_file(p, 40);
  EXPECT_NE(data_error([&] { ShardReader r(p); }).find(p), std::string::npos);

  write_shard(p, TokenDtype::kU16, docs);
  patch(p, 64 + 8, std::string("\x09\0\0\0\0\0\0\0", 8));  // offsets[1] = 9 > offsets[2] = 4
  EXPECT_NE(data_error([&] { ShardReader r(p); }).find("corrupt document index"), std::string::npos);

  EXPECT_NE(data_error([&] { ShardReader r(tmp / "missing.bin"); }).find("missing.bin"), std::string::npos);
}

TEST(ShardTest, OutOfRangeReadsThrow) {
  TempDir tmp;
  write_shard(tmp / "s.bin", TokenDtype::kU16, {{1, 2}});
  ShardReader r(tmp / "s.bin");
  std::vector<uint32_t> out(3);
  EXPECT_THROW(r.read_tokens(0, 3, out.data()), Error);
  EXPECT_THROW(r.doc_offset(2), Error);
}

// A dataset of bytes-tokenizer shards (EOS 256) built from {split, docs} per shard.
Manifest make_dataset(const std::string& dir, const std::vector<std::pair<std::string, Docs>>& shards) {
  Manifest m;
  m.dtype = "uint16";
  m.tokenizer = {"bytes", 258, 256, 257, "", hex64(xxh64("bytes", 5))};
  int n = 0;
  for (const auto& [split, docs] : shards) {
    ShardInfo s{split + "_" + std::to_string(n++) + ".bin", split, 0, docs.size(), ""};
    for (const auto& d : docs) s.tokens += d.size();
    s.xxh64 = hex64(write_shard(dir + "/" + s.file, TokenDtype::kU16, docs));
    m.shards.push_back(s);
  }
  m.data_version = compute_data_version(m.shards, m.tokenizer.hash);
  files::write_file_atomic(dir + "/manifest.json", m.to_json());
  m.dir = dir;
  return m;
}

TEST(ManifestTest, RoundTripAndVerify) {
  TempDir tmp;
  Manifest m = make_dataset(tmp.path(), {{"train", {{1, 2}, {3}}}, {"train", {{4}}}, {"val", {{5, 6, 7}}}});
  Manifest l = Manifest::load(tmp.path());
  EXPECT_EQ(l.to_json(), m.to_json());
  EXPECT_EQ(l.dir, tmp.path());
  EXPECT_EQ(l.split("train").size(), 2u);
  EXPECT_EQ(l.split_tokens("train"), 4u);
  EXPECT_EQ(l.split_tokens("val"), 3u);
  EXPECT_NO_THROW(l.verify());
  write_shard(tmp / l.shards[1].file, TokenDtype::kU16, {{9}});
  EXPECT_NE(data_error([&] { l.verify(); }).find(l.shards[1].file + ": checksum"), std::string::npos);
}

TEST(ManifestTest, DataVersionDependsOnEveryChecksumAndTheTokenizer) {
  std::vector<ShardInfo> a = {{"t0", "train", 1, 1, "0000000000000001"}, {"v0", "val", 1, 1, "0000000000000002"}};
  auto b = a;
  b[1].xxh64 = "0000000000000003";
  EXPECT_NE(compute_data_version(a, "h"), compute_data_version(b, "h"));
  EXPECT_NE(compute_data_version(a, "h"), compute_data_version(a, "g"));
  EXPECT_EQ(compute_data_version(a, "h"), compute_data_version(a, "h"));
}

TEST(ManifestTest, LoadErrorsNameFileAndField) {
  TempDir tmp;
  const std::string path = tmp / "manifest.json";
  EXPECT_NE(data_error([&] { Manifest::load(tmp.path()); }).find(path), std::string::npos);

  test::write_text(path, "{\"version\": 1,");
  std::string e = data_error([&] { Manifest::load(tmp.path()); });
  EXPECT_NE(e.find(path + ": invalid JSON"), std::string::npos) << e;

  make_dataset(tmp.path(), {{"train", {{1, 2}}}});
  const auto good = nlohmann::json::parse(test::read_text(path));
  auto expect_field_error = [&](const std::function<void(nlohmann::json&)>& edit, const std::string& field) {
    auto j = good;
    edit(j);
    test::write_text(path, j.dump());
    std::string msg = data_error([&] { Manifest::load(tmp.path()); });
    EXPECT_NE(msg.find(path + ": field '" + field + "'"), std::string::npos) << msg;
  };
  expect_field_error([](auto& j) { j["tokenizer"].erase("vocab_size"); }, "tokenizer.vocab_size");
  expect_field_error([](auto& j) { j.erase("shards"); }, "shards");
  expect_field_error([](auto& j) { j["shards"][0]["tokens"] = "2"; }, "shards[0].tokens");
  expect_field_error([](auto& j) { j["shards"][0]["split"] = "test"; }, "shards[0].split");
  expect_field_error([](auto& j) { j["version"] = 2; }, "version");
  expect_field_error([](auto& j) { j["dtype"] = "uint32"; }, "dtype");
  expect_field_error([](auto& j) { j["data_version"] = "0000000000000000"; }, "data_version");
}

// The split's stream: every document followed by EOS, repeated forever.
std::vector<int64_t> stream_of(const std::vector<Docs>& shards, size_t n) {
  std::vector<int64_t> one;
  for (const auto& docs : shards)
    for (const auto& d : docs) {
      one.insert(one.end(), d.begin(), d.end());
      one.push_back(256);
    }
  std::vector<int64_t> out;
  while (out.size() < n) out.insert(out.end(), one.begin(), one.end());
  out.resize(n);
  return out;
}

TEST(ValReaderTest, WindowsOverlapByOneAcrossShardsAndEpochs) {
  TempDir tmp;
  const Docs s0 = {{10, 11, 12}, {13}}, s1 = {{}, {14, 15}};
  Manifest m = make_dataset(tmp.path(), {{"train", s0}, {"val", {{20}}}, {"train", s1}});
  const int64_t T = 3;
  ValReader r(m, "train", T);
  std::vector<int64_t> out;
  r.next(1, out);
  EXPECT_EQ(out, (std::vector<int64_t>{10, 11, 12, 256}));
  r.next(2, out);
  EXPECT_EQ(out, (std::vector<int64_t>{256, 13, 256, 256, 256, 14, 15, 256}));
  EXPECT_EQ(r.epoch(), 0);
  r.next(1, out);  // crosses into epoch 1
  EXPECT_EQ(out, (std::vector<int64_t>{256, 10, 11, 12}));
  EXPECT_EQ(r.epoch(), 1);

  // Window k is stream[kT, kT+T+1) of the endless stream (period 10 here).
  const auto stream = stream_of({s0, s1}, 200);
  r.reset();
  EXPECT_EQ(r.epoch(), 0);
  for (int64_t k = 0; k < 40; k += 2) {
    r.next(2, out);
    ASSERT_EQ(out.size(), 2u * (T + 1));
    for (int64_t b = 0; b < 2; ++b)
      for (int64_t t = 0; t <= T; ++t) ASSERT_EQ(out[b * (T + 1) + t], stream[(k + b) * T + t]) << k << " " << b << " " << t;
    EXPECT_EQ(r.epoch(), ((k + 1) * T + T) / 10) << k;
  }
}

TEST(ValReaderTest, ShortOrMissingSplitIsDataError) {
  TempDir tmp;
  Manifest m = make_dataset(tmp.path(), {{"train", {{1, 2}, {3}}}});  // stream: 1 2 E 3 E
  EXPECT_NO_THROW(ValReader(m, "train", 4));
  std::string e = data_error([&] { ValReader(m, "train", 5); });
  EXPECT_NE(e.find(tmp.path() + ": split 'train' holds 5 tokens"), std::string::npos) << e;
  e = data_error([&] { ValReader(m, "val", 1); });
  EXPECT_NE(e.find(tmp.path() + ": split 'val' has no shards"), std::string::npos) << e;
}

TEST(ValReaderTest, ShardThatDoesNotMatchManifestIsDataError) {
  TempDir tmp;
  Manifest m = make_dataset(tmp.path(), {{"train", {{1, 2}, {3}}}});
  write_shard(tmp / m.shards[0].file, TokenDtype::kU16, {{1, 2, 3}});
  std::string e = data_error([&] { ValReader(m, "train", 2); });
  // The checksum is checked before the shard's tokens are first used, so it is what tells.
  EXPECT_NE(e.find(m.shards[0].file + ": checksum"), std::string::npos) << e;
}

}  // namespace
}  // namespace lm::data
