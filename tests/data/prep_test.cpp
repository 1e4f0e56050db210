// The real `prep` binary: document modes and inputs, tokenizer round trips, determinism across
// runs and thread counts, the val split, bad input (exit 2, one line, no output left behind), the
// output swap, and the Python reader of data/FORMAT.md.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <random>
#include <set>
#include <sstream>

#include "data/format/manifest.h"
#include "data/prep/prep.h"
#include "data/loader/val_reader.h"
#include "data/format/shard.h"
#include "data/tokenizer/tokenizer.h"
#include "tests/testutil.h"
#include "common/checksum.h"
#include "common/files.h"

namespace lm::data {
namespace {

using test::read_text;
using test::run_bin;
using test::TempDir;
using test::write_text;
namespace stdfs = std::filesystem;

// Runs prep quietly; fails the test unless it exits 0.
Manifest prep_ok(std::vector<std::string> args, const std::string& stdin_text = "") {
  args.push_back("--quiet");
  auto r = run_bin("prep", args, stdin_text);
  EXPECT_EQ(r.exit_code, 0) << r.out;
  EXPECT_EQ(r.out, "");
  const auto out = std::find(args.begin(), args.end(), "--out");
  return Manifest::load(*(out + 1));
}

// Every document of one split (or all, in manifest order), decoded.
std::vector<std::string> docs_of(const Manifest& m, const std::string& split = "") {
  auto tok = load_tokenizer(m);
  std::vector<std::string> out;
  for (const auto& s : m.shards) {
    if (!split.empty() && s.split != split) continue;
    ShardReader r(m.dir + "/" + s.file);
    for (uint64_t i = 0; i < r.num_docs(); ++i) out.push_back(tok->decode(r.read_doc(i)));
  }
  return out;
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);)
    if (!l.empty()) out.push_back(l);
  return out;
}

// name -> bytes of every file in a directory.
std::map<std::string, std::string> files_of(const std::string& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : stdfs::directory_iterator(dir)) out[e.path().filename().string()] = read_text(e.path().string());
  return out;
}

// Text that a lossy normalizer would change: runs of spaces, tabs, edges, non-ASCII.
const std::vector<std::string> kOddLines = {"Tabs\there  and  double  spaces", "  leading and trailing  ",
                                            "ünïcödé 日本語 ✓ and emoji 🙂", "UPPER lower 12345 !?"};

// The synthetic corpus (30 words) plus pseudo-words, so that unigram has enough pieces for 400.
std::string sp_corpus() {
  std::string text = test::synthetic_corpus(600, 3);
  std::mt19937 rng(7);
  for (int i = 0; i < 300; ++i) {
    for (int w = 0; w < 8; ++w) {
      for (int c = 0, n = 2 + static_cast<int>(rng() % 7); c < n; ++c) text += static_cast<char>('a' + rng() % 26);
      text += w < 7 ? " " : ".\n";
    }
  }
  for (const auto& l : kOddLines) text += l + "\n";
  return text;
}

TEST(PrepTest, LineDocsSkipBlankLines) {
  TempDir tmp;
  write_text(tmp / "in.txt", "a b\n\n  \t\nc d\r\ne\n");
  Manifest m = prep_ok({tmp / "in.txt", "--out", tmp / "out", "--val-fraction", "0"});
  EXPECT_EQ(docs_of(m), (std::vector<std::string>{"a b", "c d", "e"}));
  EXPECT_EQ(m.split("val").size(), 0u);
}

TEST(PrepTest, ParagraphDocs) {
  TempDir tmp;
  write_text(tmp / "in.txt", "l1\nl2\n\n\nl3\n \nl4\nl5");
  Manifest m = prep_ok({tmp / "in.txt", "--out", tmp / "out", "--docs", "paragraph", "--val-fraction", "0"});
  EXPECT_EQ(docs_of(m), (std::vector<std::string>{"l1\nl2", "l3", "l4\nl5"}));
}

TEST(PrepTest, JsonlDocsAndTextField) {
  TempDir tmp;
  write_text(tmp / "a.jsonl", "{\"text\": \"x y\", \"id\": 1}\n\n{\"text\": \"multi\\nline\"}\n{\"text\": \"\"}\n");
  Manifest m = prep_ok({tmp / "a.jsonl", "--out", tmp / "out", "--docs", "jsonl", "--val-fraction", "0"});
  EXPECT_EQ(docs_of(m), (std::vector<std::string>{"x y", "multi\nline"}));
  write_text(tmp / "b.jsonl", "{\"body\": \"one\"}\n{\"body\": \"two\"}\n");
  m = prep_ok({tmp / "b.jsonl", "--out", tmp / "out", "--docs", "jsonl", "--text-field", "body", "--val-fraction", "0"});
  EXPECT_EQ(docs_of(m), (std::vector<std::string>{"one", "two"}));
}

TEST(PrepTest, StdinInput) {
  TempDir tmp;
  Manifest m = prep_ok({"-", "--out", tmp / "out", "--val-fraction", "0"}, "first\nsecond\n\nthird\n");
  EXPECT_EQ(docs_of(m), (std::vector<std::string>{"first", "second", "third"}));
}

TEST(PrepTest, DirectoryInputIsRecursiveInPathOrder) {
  TempDir tmp;
  write_text(tmp / "d/b.txt", "b1\nb2\n");
  write_text(tmp / "d/a.txt", "a1\n");
  write_text(tmp / "d/a/z.txt", "z1\n");
  write_text(tmp / "d/sub/c.txt", "c1\n");
  write_text(tmp / "extra.txt", "x1\n");
  Manifest m = prep_ok({tmp / "d", tmp / "extra.txt", "--out", tmp / "out", "--val-fraction", "0"});
  EXPECT_EQ(docs_of(m), (std::vector<std::string>{"a1", "z1", "b1", "b2", "c1", "x1"}));
}

TEST(PrepTest, BytesRoundTripShardSizesAndSplit) {
  TempDir tmp;
  std::string text = test::synthetic_corpus(400);
  const std::string big(1500, 'x');
  text += big + "\n";
  write_text(tmp / "in.txt", text);
  Manifest m = prep_ok({tmp / "in.txt", "--out", tmp / "out", "--shard-tokens", "1000", "--val-fraction", "0.2"});
  EXPECT_EQ(m.tokenizer.kind, "bytes");
  EXPECT_EQ(m.dtype, "uint16");
  EXPECT_GT(m.split("train").size(), 5u);
  for (const auto& s : m.shards) EXPECT_TRUE(s.tokens <= 1000 || s.docs == 1) << s.file << " " << s.tokens;
  EXPECT_NO_THROW(m.verify());

  std::vector<std::string> train, val;
  for (const auto& l : lines_of(text)) (is_val_document(l, 0, 0.2) ? val : train).push_back(l);
  EXPECT_EQ(docs_of(m, "train"), train);
  EXPECT_EQ(docs_of(m, "val"), val);

  auto tok = load_tokenizer(m);
  std::string all;
  for (int c = 0; c < 256; ++c) all += static_cast<char>(c);
  EXPECT_EQ(tok->decode(tok->encode(all)), all);
  auto ids = tok->encode("hi");
  ids.insert(ids.begin(), m.tokenizer.pad_id);
  ids.push_back(m.tokenizer.eos_id);
  EXPECT_EQ(tok->decode(ids), "hi");
}

void sentencepiece_round_trip(const std::string& type) {
  TempDir tmp;
  const std::string text = sp_corpus();
  write_text(tmp / "in.txt", text);
  Manifest m = prep_ok({tmp / "in.txt", "--out", tmp / "out", "--tokenizer", "sentencepiece", "--sp-type", type,
                        "--vocab-size", "400", "--val-fraction", "0"});
  EXPECT_EQ(m.tokenizer.kind, "sentencepiece");
  EXPECT_EQ(m.tokenizer.vocab_size, 400u);
  EXPECT_EQ(m.tokenizer.file, "tokenizer.model");
  EXPECT_EQ(m.tokenizer.hash, hex64(xxh64_file(tmp / "out/tokenizer.model")));
  EXPECT_NE(m.tokenizer.eos_id, m.tokenizer.pad_id);
  EXPECT_NO_THROW(m.verify());
  EXPECT_EQ(docs_of(m), lines_of(text));
  EXPECT_LT(m.split_tokens("train"), text.size() / 2);  // it does compress

  auto tok = load_tokenizer(m);
  for (const std::string s : {"Zebra quixotic  jumps\tover", " é ü 中文 \xF0\x9F\x99\x82 ", "two\nlines\r\n", "x"}) {
    auto ids = tok->encode(s);
    EXPECT_EQ(tok->decode(ids), s);
    ids.insert(ids.begin(), m.tokenizer.eos_id);
    ids.push_back(m.tokenizer.pad_id);
    EXPECT_EQ(tok->decode(ids), s);
  }
}

TEST(PrepTest, SentencePieceBpeRoundTrip) { sentencepiece_round_trip("bpe"); }
TEST(PrepTest, SentencePieceUnigramRoundTrip) { sentencepiece_round_trip("unigram"); }

TEST(PrepTest, SpModelGivesTheSameShards) {
  TempDir tmp;
  write_text(tmp / "in.txt", sp_corpus());
  prep_ok({tmp / "in.txt", "--out", tmp / "a", "--tokenizer", "sentencepiece", "--vocab-size", "350"});
  prep_ok({tmp / "in.txt", "--out", tmp / "b", "--tokenizer", "sentencepiece", "--sp-model", tmp / "a/tokenizer.model"});
  EXPECT_EQ(files_of(tmp / "a"), files_of(tmp / "b"));
}

TEST(PrepTest, SameInputGivesIdenticalOutputWhateverTheThreads) {
  TempDir tmp;
  write_text(tmp / "in.txt", sp_corpus());
  const std::vector<std::vector<std::string>> configs = {
      {"--tokenizer", "bytes"},
      {"--tokenizer", "sentencepiece", "--vocab-size", "400"},
      {"--tokenizer", "sentencepiece", "--sp-type", "unigram", "--vocab-size", "400"}};
  for (const auto& cfg : configs) {
    std::map<std::string, std::string> first;
    for (const char* threads : {"1", "3", "3"}) {
      std::vector<std::string> args = {tmp / "in.txt", "--out", tmp / "out", "--shard-tokens", "2000",
                                       "--val-fraction", "0.1", "--threads", threads};
      args.insert(args.end(), cfg.begin(), cfg.end());
      prep_ok(args);
      auto files = files_of(tmp / "out");
      EXPECT_GT(files.size(), 3u);
      if (first.empty()) first = files;
      EXPECT_TRUE(files == first) << cfg[1] << " threads " << threads;
    }
  }
}

TEST(PrepTest, ValSplitIsNonEmptyAndStable) {
  TempDir tmp;
  const std::string text = test::synthetic_corpus(1000, 5);
  auto lines = lines_of(text);
  std::string reversed;
  for (auto it = lines.rbegin(); it != lines.rend(); ++it) reversed += *it + "\n";
  write_text(tmp / "in.txt", text);
  write_text(tmp / "rev.txt", reversed);
  auto val_set = [&](const std::string& input, const std::string& seed) {
    Manifest m = prep_ok({input, "--out", tmp / "out", "--val-fraction", "0.1", "--split-seed", seed, "--threads", "2"});
    auto v = docs_of(m, "val");
    return std::multiset<std::string>(v.begin(), v.end());
  };
  auto a = val_set(tmp / "in.txt", "0");
  EXPECT_GT(a.size(), 50u);
  EXPECT_LT(a.size(), 150u);
  EXPECT_EQ(val_set(tmp / "rev.txt", "0"), a);
  EXPECT_NE(val_set(tmp / "in.txt", "7"), a);
}

TEST(PrepTest, BadInputExitsTwoWithOneLineAndLeavesNoOutput) {
  TempDir tmp;
  write_text(tmp / "good.txt", sp_corpus());
  write_text(tmp / "blank.txt", "\n  \n\n");
  write_text(tmp / "bad.jsonl", "{\"text\": \"ok\"}\n{\"text\": oops}\n");
  write_text(tmp / "nofield.jsonl", "{\"body\": \"x\"}\n");
  struct Case {
    std::vector<std::string> args;
    std::string expect;  // in the error line
  };
  const std::vector<Case> cases = {
      {{tmp / "missing.txt"}, tmp / "missing.txt: no such file"},
      {{tmp / "blank.txt"}, "no documents in the input (" + tmp / "blank.txt"},
      {{tmp / "bad.jsonl", "--docs", "jsonl"}, tmp / "bad.jsonl:2: invalid JSON"},
      {{tmp / "nofield.jsonl", "--docs", "jsonl"}, tmp / "nofield.jsonl:1: record has no \"text\" field"},
      {{tmp / "good.txt", "--tokenizer", "sentencepiece", "--vocab-size", "100"}, "--vocab-size 100"},
      {{tmp / "good.txt", "--tokenizer", "sentencepiece", "--vocab-size", "60000"}, "--vocab-size 60000"},
      {{tmp / "good.txt", "--tokenizer", "sentencepiece"}, "--vocab-size is required"},
      {{tmp / "good.txt", "--tokenizer", "sentencepiece", "--sp-model", tmp / "no.model"}, tmp / "no.model"},
      {{tmp / "good.txt", "--frobnicate"}, "--frobnicate"},
      {{tmp / "good.txt", "--docs", "pages"}, "--docs: 'pages'"},
      {{tmp / "good.txt", "--val-fraction", "1.5"}, "--val-fraction"},
  };
  prep_ok({tmp / "good.txt", "--out", tmp / "old"});
  const auto old_files = files_of(tmp / "old");
  for (const auto& c : cases) {
    for (const std::string& out : {tmp / "new", tmp / "old"}) {
      auto args = c.args;
      args.insert(args.end(), {"--out", out});
      auto r = run_bin("prep", args);
      EXPECT_EQ(r.exit_code, 2) << r.out;
      EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;
      EXPECT_EQ(r.out.rfind("prep: error: ", 0), 0u) << r.out;
      EXPECT_NE(r.out.find(c.expect), std::string::npos) << "expected '" << c.expect << "' in: " << r.out;
    }
    EXPECT_FALSE(files::exists(tmp / "new"));
    EXPECT_EQ(files_of(tmp / "old"), old_files);
    for (const auto& e : stdfs::directory_iterator(tmp.path()))
      EXPECT_EQ(e.path().filename().string().find(".tmp."), std::string::npos) << e.path();
  }
}

TEST(PrepTest, HelpExitsZero) {
  auto r = run_bin("prep", {"--help"});
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_NE(r.out.find("--vocab-size"), std::string::npos);
}

TEST(PrepTest, SuccessReplacesPreviousOutput) {
  TempDir tmp;
  write_text(tmp / "a.txt", "alpha\n");
  write_text(tmp / "b.txt", "beta\ngamma\n");
  prep_ok({tmp / "a.txt", "--out", tmp / "out", "--val-fraction", "0"});
  Manifest m = prep_ok({tmp / "b.txt", "--out", tmp / "out/", "--val-fraction", "0"});
  EXPECT_EQ(docs_of(m), (std::vector<std::string>{"beta", "gamma"}));
  EXPECT_EQ(std::distance(stdfs::directory_iterator(tmp.path()), stdfs::directory_iterator()), 3);
}

TEST(PrepTest, RefusesToReplaceADirectoryThatIsNotADataset) {
  TempDir tmp;
  write_text(tmp / "a.txt", "alpha\n");
  write_text(tmp / "out/precious.txt", "keep me");
  auto r = run_bin("prep", {tmp / "a.txt", "--out", tmp / "out"});
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("no manifest.json"), std::string::npos) << r.out;
  EXPECT_EQ(read_text(tmp / "out/precious.txt"), "keep me");
}

TEST(PrepTest, ProgressOnStderrUnlessQuiet) {
  TempDir tmp;
  write_text(tmp / "a.txt", test::synthetic_corpus(50));
  auto r = run_bin("prep", {tmp / "a.txt", "--out", tmp / "out"});
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_NE(r.out.find("50 documents"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("MB/s"), std::string::npos) << r.out;
  r = run_bin("prep", {tmp / "a.txt", "--out", tmp / "out", "--quiet"});
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(r.out, "");
}

TEST(PrepTest, ValReaderStreamsPreparedDocuments) {
  TempDir tmp;
  write_text(tmp / "a.txt", "abc\nde\n");
  Manifest m = prep_ok({tmp / "a.txt", "--out", tmp / "out", "--val-fraction", "0"});
  ValReader r(m, "train", 4);
  std::vector<int64_t> out;
  r.next(2, out);
  EXPECT_EQ(out, (std::vector<int64_t>{'a', 'b', 'c', 256, 'd', 'd', 'e', 256, 'a', 'b'}));
}

// The Python/numpy reader in data/format/FORMAT.md reads what prep wrote (a second implementation).
TEST(PrepTest, FormatDocPythonReaderReadsShards) {
  if (run_bin("/usr/bin/python3", {"-c", "import numpy"}).exit_code != 0) GTEST_SKIP() << "no python3 with numpy";
  TempDir tmp;
  const std::string doc = read_text(test::source_path("data/format/FORMAT.md"));
  const auto begin = doc.find("```python\n");
  ASSERT_NE(begin, std::string::npos);
  const auto end = doc.find("```", begin + 10);
  write_text(tmp / "reader.py", doc.substr(begin + 10, end - begin - 10));
  write_text(tmp / "a.txt", "first line\n" + test::synthetic_corpus(300));
  Manifest m = prep_ok({tmp / "a.txt", "--out", tmp / "out", "--shard-tokens", "3000", "--val-fraction", "0"});
  auto r = run_bin("/usr/bin/python3", {tmp / "reader.py", tmp / "out"});
  ASSERT_EQ(r.exit_code, 0) << r.out;
  std::string want;
  for (const auto& s : m.shards) {
    ShardReader sr(m.dir + "/" + s.file);
    want += s.file + " train " + std::to_string(s.docs) + " " + std::to_string(s.tokens) + " " +
            load_tokenizer(m)->decode(sr.read_doc(0)) + "\n";
  }
  EXPECT_EQ(r.out, want);
  EXPECT_NE(r.out.find("train_000000.bin train"), std::string::npos);
  EXPECT_NE(r.out.find(" first line\n"), std::string::npos);
}

}  // namespace
}  // namespace lm::data
