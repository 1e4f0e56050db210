// Raw text sources (data/text/): the loader tokenizes text, JSONL and .zst files itself and must
// give exactly what `prep` writes for the same files (documents, tokens, splits, batches), resume
// exactly, keep its index current, and name a file that changed under its index.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <set>
#include <thread>
#include <random>
#include <string>
#include <vector>

#include "common/files.h"
#include "data/format/manifest.h"
#include "data/format/shard.h"
#include "data/loader/loader.h"
#include "data/loader/val_reader.h"
#include "data/prep/prep.h"
#include "data/text/text_source.h"
#include "data/tokenizer/tokenizer.h"
#include "tests/testutil.h"

namespace lm::data {
namespace {

using test::TempDir;
namespace stdfs = std::filesystem;

// ~n lines of varied words (some blank, some with '\r'), deterministic.
std::string corpus(int n, uint32_t seed) {
  static const char* words[] = {"in", "the", "beginning", "God", "created", "heaven", "and", "earth", "ünïcode", "λόγος",
                                "light", "was", "darkness", "upon", "face", "of", "deep", "\"quoted\"", "tab\there"};
  std::mt19937 rng(seed);
  std::string out;
  for (int i = 0; i < n; ++i) {
    if (rng() % 13 == 0) out += "   \n";  // blank: separates or is skipped
    const int k = 1 + static_cast<int>(rng() % 30);
    for (int w = 0; w < k; ++w) out += std::string(w ? " " : "") + words[rng() % (sizeof words / sizeof *words)];
    out += rng() % 17 == 0 ? "\r\n" : "\n";
  }
  return out;
}

std::string jsonl_of(const std::string& text) {
  std::string out;
  size_t at = 0;
  for (size_t nl; (nl = text.find('\n', at)) != std::string::npos; at = nl + 1) {
    std::string line = text.substr(at, nl - at), esc;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    for (char ch : line) esc += ch == '"' ? std::string("\\\"") : ch == '\t' ? std::string("\\t") : std::string(1, ch);
    out += "{\"id\": 1, \"body\": \"" + esc + "\"}\n";
  }
  return out;
}

void zstd_file(const std::string& in, const std::string& out) {
  ASSERT_EQ(std::system(("zstd -q -f -o '" + out + "' '" + in + "'").c_str()), 0) << "zstd CLI (Debian zstd)";
}

// The token streams of one split, document by document, as the manifest's shards hold them.
std::vector<std::vector<uint32_t>> docs_of(const Manifest& m, const std::string& split) {
  std::vector<std::vector<uint32_t>> out;
  for (const auto& s : m.split(split)) {
    auto r = m.open_shard(s);
    for (uint64_t i = 0; i < r->num_docs(); ++i) out.push_back(r->read_doc(i));
  }
  return out;
}

Manifest prep(const std::vector<std::string>& args) {
  std::vector<std::string> a = args;
  a.push_back("--quiet");
  auto r = test::run_bin("prep", a);
  EXPECT_EQ(r.exit_code, 0) << r.out;
  return Manifest::load(args.at(std::find(args.begin(), args.end(), "--out") - args.begin() + 1));
}

// This process links libsentencepiece (lm_tok): tokenizers load directly, not through the plugin
// (whose RTLD_DEEPBIND the sanitizer builds cannot load).
std::unique_ptr<Tokenizer> direct_tokenizer(const std::string& what) {
  return what == "bytes" ? make_bytes_tokenizer() : load_sentencepiece(what);
}

TextSourceOptions text_options(const std::string& docs, const std::string& tmp, uint64_t chunk_tokens = 3000) {
  TextSourceOptions o;
  o.load_tokenizer = direct_tokenizer;
  o.text.docs = docs;
  o.text.text_field = "body";
  o.text.val_fraction = 0.1;
  o.text.split_seed = 7;
  o.text.chunk_tokens = chunk_tokens;
  o.cache_dir = tmp + "/cache";
  o.threads = 2;
  return o;
}

// Every document mode (line, paragraph, JSONL) x plain and zstd x bytes and BPE: the same
// documents, tokens and splits as prep writes for the plain file, in many small chunks. And zstd
// files of two frames concatenated (chunks in the second frame seek to it), a directory of them.
TEST(TextSource, TokensEqualPrepForEveryDocumentModeAndCompression) {
  TempDir tmp;
  const std::string a = corpus(1500, 1), b = corpus(900, 2);
  test::write_text(tmp / "a.txt", a);
  test::write_text(tmp / "b.txt", b);
  test::write_text(tmp / "a.jsonl", jsonl_of(a));
  zstd_file(tmp / "a.txt", tmp / "a.txt.zst");
  zstd_file(tmp / "a.jsonl", tmp / "a.jsonl.zst");
  files::make_dirs(tmp / "z");
  zstd_file(tmp / "a.txt", tmp / "z/1.zst");
  zstd_file(tmp / "b.txt", tmp / "b.zst");
  // Two frames: a frame of a.txt, then one of b.txt (chunks in the second frame seek to it).
  files::write_file_atomic(tmp / "z/2.zst", files::read_file(tmp / "z/1.zst") + files::read_file(tmp / "b.zst"));
  // One BPE model for every case (prep trains it once; the cases use it by path).
  prep({tmp / "a.txt", "--tokenizer", "sentencepiece", "--vocab-size", "400", "--out", tmp / "bpe"});
  const std::string bpe = tmp / "bpe/tokenizer.model";
  struct Case {
    std::string docs, raw;                 // raw text source: a file or a directory
    std::vector<std::string> prep_inputs;  // the same documents for prep
    std::string tokenizer;                 // "bytes" or the BPE model
  };
  std::vector<Case> cases;
  for (const std::string& tok : {std::string("bytes"), bpe})
    for (const std::string docs : {"line", "paragraph", "jsonl"}) {
      const std::string plain = tmp / (docs == "jsonl" ? "a.jsonl" : "a.txt");
      cases.push_back({docs, plain, {plain}, tok});
      cases.push_back({docs, plain + ".zst", {plain}, tok});
    }
  cases.push_back({"line", tmp / "z", {tmp / "a.txt", tmp / "a.txt", tmp / "b.txt"}, "bytes"});
  cases.push_back({"line", tmp / "z", {tmp / "z"}, "bytes"});  // prep reads .zst too
  int n = 0;
  for (const auto& c : cases) {
    const bool sp = c.tokenizer != "bytes";
    SCOPED_TRACE(c.docs + " " + c.raw + (sp ? " BPE" : " bytes"));
    std::vector<std::string> args = c.prep_inputs;
    for (const std::string x : {"--docs", c.docs.c_str(), "--text-field", "body", "--val-fraction", "0.1", "--split-seed",
                                "7", "--out"})
      args.push_back(x);
    args.push_back(tmp / ("prep_" + std::to_string(n++)));
    if (sp) args.insert(args.end(), {"--tokenizer", "sentencepiece", "--sp-model", c.tokenizer});
    const Manifest want = prep(args);
    auto o = text_options(c.docs, tmp.path(), sp ? 1500 : 3000);
    o.tokenizer = c.tokenizer;
    const Manifest got = open_text_dataset(c.raw, "data.train", o);
    EXPECT_GT(got.split("train").size(), 3u);  // several chunks
    EXPECT_EQ(got.tokenizer.hash, want.tokenizer.hash);
    EXPECT_EQ(got.tokenizer.kind, sp ? "sentencepiece" : "bytes");
    EXPECT_EQ(got.split_tokens("train"), want.split_tokens("train"));
    EXPECT_EQ(docs_of(got, "train"), docs_of(want, "train"));
    EXPECT_EQ(docs_of(got, "val"), docs_of(want, "val"));
    EXPECT_GT(got.split("val").size(), 0u);
    EXPECT_EQ(got.source->kind(), "text");
  }
}

// Records the threads that tokenize (encode), once armed.
struct EncodeThreads {
  std::mutex mu;
  bool armed = false;
  std::set<std::thread::id> ids;
  int calls = 0;
};
class RecordingTokenizer : public Tokenizer {
 public:
  RecordingTokenizer(std::unique_ptr<Tokenizer> inner, std::shared_ptr<EncodeThreads> rec)
      : inner_(std::move(inner)), rec_(std::move(rec)) {}
  std::vector<uint32_t> encode(const std::string& text) const override {
    {
      std::lock_guard<std::mutex> lk(rec_->mu);
      if (rec_->armed) rec_->ids.insert(std::this_thread::get_id()), ++rec_->calls;
    }
    return inner_->encode(text);
  }
  std::string decode(const std::vector<uint32_t>& ids) const override { return inner_->decode(ids); }
  const TokenizerInfo& info() const override { return inner_->info(); }

 private:
  std::unique_ptr<Tokenizer> inner_;
  std::shared_ptr<EncodeThreads> rec_;
};

// Evaluation reads the val split on the training thread: every val chunk, not only the first, is
// tokenized by the source's own threads, never by the thread that reads it; the windows are those
// of prep's val split.
TEST(TextSource, ValChunksAreNeverTokenizedByTheReadingThread) {
  TempDir tmp;
  test::write_text(tmp / "a.txt", corpus(3000, 5));
  auto rec = std::make_shared<EncodeThreads>();
  auto o = text_options("line", tmp.path(), 1000);
  o.text.val_fraction = 0.3;
  o.load_tokenizer = [rec](const std::string& what) -> std::unique_ptr<Tokenizer> {
    return std::make_unique<RecordingTokenizer>(direct_tokenizer(what), rec);
  };
  const Manifest got = open_text_dataset(tmp / "a.txt", "data.train", o);
  const Manifest want = prep({tmp / "a.txt", "--val-fraction", "0.3", "--split-seed", "7", "--out", tmp / "prep"});
  ASSERT_GE(got.split("val").size(), 4u);
  {
    std::lock_guard<std::mutex> lk(rec->mu);
    rec->armed = true;  // from here: tokenizing chunks, not building the index
  }
  ValReader vr(got, "val", 32), vw(want, "val", 32);
  uint64_t stream = 0;
  for (const auto& s : got.split("val")) stream += s.tokens + s.docs;
  std::vector<int64_t> x, y;
  for (uint64_t read = 0; read < stream * 3 / 2; read += 8 * 32) {  // one and a half passes over the split
    vr.next(8, x), vw.next(8, y);
    ASSERT_EQ(x, y) << "at token " << read;
  }
  std::lock_guard<std::mutex> lk(rec->mu);
  EXPECT_GT(rec->calls, 0);
  EXPECT_EQ(rec->ids.count(std::this_thread::get_id()), 0u) << "the reading thread tokenized";
}

// A sentencepiece model given by path: the tokens prep writes with that model.
TEST(TextSource, SentencepieceModelByPathEqualsPrep) {
  TempDir tmp;
  test::write_text(tmp / "a.txt", corpus(2000, 3));
  const Manifest want = prep({tmp / "a.txt", "--tokenizer", "sentencepiece", "--vocab-size", "400", "--val-fraction", "0.1",
                              "--split-seed", "7", "--out", tmp / "sp"});
  auto o = text_options("line", tmp.path(), 2000);
  o.tokenizer = tmp / "sp/tokenizer.model";
  const Manifest got = open_text_dataset(tmp / "a.txt", "data.train", o);
  EXPECT_EQ(got.tokenizer.hash, want.tokenizer.hash);
  EXPECT_EQ(got.tokenizer.vocab_size, want.tokenizer.vocab_size);
  EXPECT_EQ(docs_of(got, "train"), docs_of(want, "train"));
  EXPECT_EQ(docs_of(got, "val"), docs_of(want, "val"));
}

DataConfig loader_config(bool shuffle) {
  DataConfig c;
  c.workers = 2, c.prefetch = 3, c.shuffle = shuffle, c.shuffle_buffer = 64;
  return c;
}

// Unshuffled, the loader's batches from raw text are those from prep's shards (the same
// EOS-joined stream); shuffled, a loader restarted from a mid-run state continues exactly.
TEST(TextSource, LoaderBatchesEqualPrepAndResumeExactly) {
  TempDir tmp;
  test::write_text(tmp / "a.txt", corpus(3000, 4));
  const Manifest shards = prep({tmp / "a.txt", "--val-fraction", "0.1", "--split-seed", "7", "--out", tmp / "p"});
  const Manifest raw = open_text_dataset(tmp / "a.txt", "data.train", text_options("line", tmp.path()));
  {
    Loader want(test::train_form(loader_config(false), shards.dir), {shards}, "train", 32, 4, 0, 1, 5), got(test::train_form(loader_config(false), raw.dir), {raw}, "train", 32, 4, 0, 1, 5);
    for (int i = 0; i < 300; ++i) ASSERT_EQ(got.next().inputs, want.next().inputs) << "batch " << i;
  }
  std::vector<uint64_t> straight;
  LoaderState mid;
  {
    Loader l(test::train_form(loader_config(true), raw.dir), {raw}, "train", 32, 4, 0, 1, 9);
    for (int i = 0; i < 400; ++i) {
      if (i == 170) mid = l.state();
      straight.push_back(l.next().hash);
    }
  }
  const Manifest again = open_text_dataset(tmp / "a.txt", "data.train", text_options("line", tmp.path()));
  Loader l(test::train_form(loader_config(true), again.dir), {again}, "train", 32, 4, 0, 1, 9);
  l.load_state(LoaderState::from_json(mid.to_json()));
  for (int i = 170; i < 400; ++i) ASSERT_EQ(l.next().hash, straight[i]) << "batch " << i;
}

// The index is built once (in the cache) and reused; `prep index` puts one next to the file that
// the loader prefers; a file grown since is indexed again; a same-size edit is named when read.
TEST(TextSource, IndexIsReusedRebuiltWhenStaleAndEditsAreNamed) {
  TempDir tmp;
  const std::string text = corpus(1500, 5);
  test::write_text(tmp / "a.txt", text);
  const auto o = text_options("line", tmp.path(), 3000);
  auto count_cached = [&] {
    size_t n = 0;
    if (stdfs::exists(tmp / "cache/text-index"))
      for (auto& e : stdfs::directory_iterator(tmp / "cache/text-index")) n += e.path().extension() == ".lmidx";
    return n;
  };
  const std::string v1 = open_text_dataset(tmp / "a.txt", "data.train", o).data_version;
  EXPECT_EQ(count_cached(), 1u);
  bool built = true;
  auto tok = make_bytes_tokenizer();
  text_index(tmp / "a.txt", o.text, *tok, o.cache_dir, 1, &built);
  EXPECT_FALSE(built);

  auto r = test::run_bin("prep", {"index", tmp / "a.txt", "--val-fraction", "0.1", "--split-seed", "7", "--quiet"});
  ASSERT_EQ(r.exit_code, 0) << r.out;
  ASSERT_TRUE(stdfs::exists(tmp / "a.txt.lmidx"));
  stdfs::remove_all(tmp / "cache");
  auto prep_opts = o;
  prep_opts.text.chunk_tokens = TextOptions().chunk_tokens;  // prep index uses the default chunks
  open_text_dataset(tmp / "a.txt", "data.train", prep_opts);
  EXPECT_EQ(count_cached(), 0u) << "the index next to the file was not used";

  test::write_text(tmp / "a.txt", text + "one more line\n");
  EXPECT_NE(open_text_dataset(tmp / "a.txt", "data.train", o).data_version, v1);  // indexed again

  // The same size and time, other bytes: caught when the chunk is read.
  const auto t = stdfs::last_write_time(tmp / "a.txt");
  std::string edited = files::read_file(tmp / "a.txt");
  edited[edited.find("the")] = 'T';
  test::write_text(tmp / "a.txt", edited);
  stdfs::last_write_time(tmp / "a.txt", t);
  const Manifest m = open_text_dataset(tmp / "a.txt", "data.train", o);
  try {
    for (const auto& s : m.split("train")) m.open_shard(s);
    FAIL() << "an edited file was read";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find(tmp / "a.txt"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("differ from its index"), std::string::npos) << e.what();
  }
}

// Bad input names the file and line; a missing file names the path.
TEST(TextSource, BadInputNamesFileAndLine) {
  TempDir tmp;
  test::write_text(tmp / "a.jsonl", "{\"body\": \"fine\"}\n{\"body\": 3}\n");
  try {
    open_text_dataset(tmp / "a.jsonl", "data.train", text_options("jsonl", tmp.path()));
    FAIL();
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("a.jsonl:2"), std::string::npos) << e.what();
  }
  test::write_text(tmp / "t.zst", "not zstd at all\n");
  EXPECT_THROW(open_text_dataset(tmp / "t.zst", "data.train", text_options("line", tmp.path())), DataError);
  EXPECT_THROW(open_text_dataset(tmp / "missing.txt", "data.train", text_options("line", tmp.path())), DataError);
}

}  // namespace
}  // namespace lm::data
