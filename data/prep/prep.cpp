// prep: inputs -> documents -> tokens (on several threads) -> train/val shards + manifest.json, built
// in a temp directory and swapped into place (see prep.h).
//
// Determinism: documents are read in a fixed order (inputs as given, directory files sorted by
// path), tokenized in batches whose results are written back in reading order, and the split is a
// hash of each document's text; nothing depends on the thread count, timing or the clock.
#include "data/prep/prep.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <sstream>
#include <thread>

#include "data/format/shard.h"
#include "data/text/documents.h"
#include "data/text/text_index.h"
#include "data/tokenizer/tokenizer.h"
#include "common/errors.h"
#include "common/clock.h"
#include "common/checksum.h"
#include "common/files.h"
#include "common/parallel.h"
#include "common/log.h"

namespace lm::data {
namespace {

namespace stdfs = std::filesystem;

constexpr const char* kSpModelFile = "tokenizer.model";
constexpr size_t kBatchBytes = 1 << 20;  // text per tokenizer work item
constexpr int kBatchesPerThread = 4;     // work items per round, per thread

// One input to read: a regular file (read on each pass) or text held in memory (stdin, pipes).
struct Source {
  std::string name;                         // for messages: the path, or "<stdin>"
  std::shared_ptr<const std::string> text;  // null for regular files
};

std::string read_stream(std::istream& in, const std::string& name) {
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) throw DataError(name + ": read failed");
  return ss.str();
}

std::vector<Source> expand_inputs(const std::vector<std::string>& inputs) {
  std::vector<Source> out;
  std::shared_ptr<const std::string> stdin_text;
  for (const auto& in : inputs) {
    if (in == "-") {
      if (!stdin_text) stdin_text = std::make_shared<const std::string>(read_stream(std::cin, "<stdin>"));
      out.push_back({"<stdin>", stdin_text});
      continue;
    }
    std::error_code ec;
    auto st = stdfs::status(in, ec);
    if (!stdfs::exists(st)) throw DataError(in + ": no such file or directory");
    if (stdfs::is_regular_file(st)) {
      out.push_back({in, nullptr});
    } else if (stdfs::is_directory(st)) {
      for (auto& f : list_text_files(in)) out.push_back({f, nullptr});
    } else {  // a pipe or device: it can be read only once
      std::ifstream f(in, std::ios::binary);
      if (!f) throw DataError(in + ": cannot open (" + std::strerror(errno) + ")");
      out.push_back({in, std::make_shared<const std::string>(read_stream(f, in))});
    }
  }
  return out;
}

// Yields the documents of all sources, in order, one pass (cut by data/text/documents.h's rules).
class DocReader {
 public:
  DocReader(const std::vector<Source>& sources, const PrepOptions& opt) : sources_(sources), opt_(opt) {}

  // The next non-blank document; false at the end. Throws DataError naming FILE[:LINE].
  bool next(std::string& doc) {
    std::string line;
    TextDoc d;
    for (;;) {
      if (!in_ && !open_next()) return false;
      if (!std::getline(*in_, line)) {
        if (in_->bad()) throw DataError(sources_[src_ - 1].name + ": read failed");
        in_.reset();
        if (!split_->finish(&d)) continue;
      } else {
        bytes_ += line.size() + 1;
        if (!split_->line(line, 0, 0, &d)) continue;
      }
      doc = std::move(d.text);
      return true;
    }
  }
  uint64_t bytes() const { return bytes_; }

 private:
  bool open_next() {
    if (src_ == sources_.size()) return false;
    const Source& s = sources_[src_++];
    if (s.text) {
      in_ = std::make_unique<std::istringstream>(*s.text);
    } else if (is_zstd(s.name)) {
      in_ = std::make_unique<std::istringstream>(read_text_file(s.name));
    } else {
      auto f = std::make_unique<std::ifstream>(s.name, std::ios::binary);
      if (!*f) throw DataError(s.name + ": cannot open (" + std::strerror(errno) + ")");
      in_ = std::move(f);
    }
    split_ = std::make_unique<DocSplitter>(opt_.docs, opt_.text_field, s.name);
    return true;
  }

  const std::vector<Source>& sources_;
  const PrepOptions& opt_;
  size_t src_ = 0;
  std::unique_ptr<std::istream> in_;
  std::unique_ptr<DocSplitter> split_;
  uint64_t bytes_ = 0;
};

// A tokenizer work item: documents in, their tokens and splits out.
struct DocBatch {
  std::vector<std::string> docs;
  std::vector<std::vector<uint32_t>> tokens;
  std::vector<char> val;
};

// The shards of one split: "SPLIT_NNNNNN.bin", each closed before it would exceed shard_tokens.
class SplitWriter {
 public:
  SplitWriter(const std::string& dir, const std::string& split, TokenDtype dtype, uint64_t shard_tokens)
      : dir_(dir), split_(split), dtype_(dtype), shard_tokens_(shard_tokens) {}

  void add(const std::vector<uint32_t>& doc) {
    if (cur_ && cur_->num_tokens() > 0 && cur_->num_tokens() + doc.size() > shard_tokens_) close();
    if (!cur_) {
      file_ = strf("%s_%06zu.bin", split_.c_str(), shards_.size());
      cur_ = std::make_unique<ShardWriter>(dir_ + "/" + file_, dtype_);
    }
    cur_->add_document(doc.data(), doc.size());
  }
  // Finishes the open shard, if any.
  void close() {
    if (!cur_) return;
    ShardInfo s{file_, split_, cur_->num_tokens(), cur_->num_docs(), ""};
    s.xxh64 = hex64(cur_->finish());
    shards_.push_back(s);
    cur_.reset();
  }
  const std::vector<ShardInfo>& shards() const { return shards_; }

 private:
  std::string dir_, split_, file_;
  TokenDtype dtype_;
  uint64_t shard_tokens_;
  std::unique_ptr<ShardWriter> cur_;
  std::vector<ShardInfo> shards_;
};

// OUT.tmp.<pid>: removed on destruction unless commit() swapped it into place as OUT.
class StagingDir {
 public:
  explicit StagingDir(std::string out) : out_(std::move(out)) {
    while (out_.size() > 1 && out_.back() == '/') out_.pop_back();
    tmp_ = out_ + ".tmp." + std::to_string(::getpid());
    std::error_code ec;
    auto st = stdfs::symlink_status(out_, ec);
    if (stdfs::exists(st)) {
      if (!stdfs::is_directory(st)) throw UsageError("--out " + out_ + ": exists and is not a directory");
      if (!stdfs::is_empty(out_, ec) && !files::exists(out_ + "/manifest.json"))
        throw UsageError("--out " + out_ + ": existing directory has no manifest.json (not a prep output); refusing to replace it");
    }
    remove_stale_temps();
    files::remove_all(tmp_);
    files::make_dirs(tmp_);
  }
  ~StagingDir() {
    if (!committed_) files::remove_all(tmp_);
  }
  StagingDir(const StagingDir&) = delete;
  StagingDir& operator=(const StagingDir&) = delete;
  const std::string& path() const { return tmp_; }

  // Swaps the finished directory into place (atomically where the file system can exchange two
  // names), then removes the previous OUT.
  void commit() {
    files::fsync_dir(tmp_);
    if (!files::exists(out_)) {
      if (std::rename(tmp_.c_str(), out_.c_str()) != 0) fail();
    } else if (::renameat2(AT_FDCWD, tmp_.c_str(), AT_FDCWD, out_.c_str(), RENAME_EXCHANGE) != 0) {
      if (errno != EINVAL && errno != ENOSYS) fail();
      const std::string old = out_ + ".old." + std::to_string(::getpid());
      if (std::rename(out_.c_str(), old.c_str()) != 0) fail();
      if (std::rename(tmp_.c_str(), out_.c_str()) != 0) {
        std::rename(old.c_str(), out_.c_str());
        fail();
      }
      files::remove_all(old);
    }
    committed_ = true;
    files::remove_all(tmp_);  // the previous OUT after an exchange; nothing otherwise
    files::fsync_dir(stdfs::path(out_).parent_path().empty() ? "." : stdfs::path(out_).parent_path().string());
  }

 private:
  // OUT.tmp.<pid> and OUT.old.<pid> of a prep that died (no such process any more): removed.
  void remove_stale_temps() const {
    const stdfs::path out(out_);
    const stdfs::path parent = out.parent_path().empty() ? stdfs::path(".") : out.parent_path();
    const std::string base = out.filename().string();
    std::error_code ec;
    for (auto& e : stdfs::directory_iterator(parent, ec)) {
      const std::string name = e.path().filename().string();
      for (const char* kind : {".tmp.", ".old."}) {
        const std::string prefix = base + kind;
        if (name.size() <= prefix.size() || name.compare(0, prefix.size(), prefix) != 0) continue;
        const std::string pid = name.substr(prefix.size());
        if (pid.empty() || pid.size() > 9 || pid.find_first_not_of("0123456789") != std::string::npos) continue;
        if (::kill(static_cast<pid_t>(std::stol(pid)), 0) == 0 || errno != ESRCH) continue;  // alive
        log::warn("removing " + e.path().string() + ", left by prep process " + pid + " which is gone");
        files::remove_all(e.path().string());
      }
    }
  }

  [[noreturn]] void fail() const {
    throw Error(out_ + ": cannot move " + tmp_ + " into place (" + std::strerror(errno) + ")");
  }
  std::string out_, tmp_;
  bool committed_ = false;
};

// Documents/tokens/bytes of the tokenizing pass so far, on stderr every few seconds and at the end.
class Progress {
 public:
  explicit Progress(bool quiet) : quiet_(quiet) {}
  void update(uint64_t docs, uint64_t tokens, uint64_t bytes, bool final = false) {
    auto now = Clock::now();
    if (quiet_ || (!final && now - last_ < std::chrono::seconds(2))) return;
    last_ = now;
    double s = std::chrono::duration<double>(now - start_).count();
    log::info(strf("prep: %s%llu documents, %llu tokens, %.1f MB read, %.1f MB/s", final ? "done: " : "",
                   static_cast<unsigned long long>(docs), static_cast<unsigned long long>(tokens), bytes / 1e6,
                   bytes / 1e6 / std::max(s, 1e-3)));
  }

 private:
  using Clock = std::chrono::steady_clock;
  bool quiet_;
  Clock::time_point start_ = Clock::now(), last_ = start_;
};

void validate(const PrepOptions& o) {
  auto one_of = [](const std::string& v, std::initializer_list<const char*> ok, const char* opt) {
    for (const char* k : ok)
      if (v == k) return;
    std::string list;
    for (const char* k : ok) list += (list.empty() ? "" : ", ") + std::string(k);
    throw UsageError(std::string(opt) + ": '" + v + "' is not one of: " + list);
  };
  if (o.inputs.empty()) throw UsageError("no INPUT given");
  if (o.out.empty()) throw UsageError("--out is required");
  one_of(o.docs, {"line", "paragraph", "jsonl"}, "--docs");
  one_of(o.tokenizer, {"bytes", "sentencepiece"}, "--tokenizer");
  one_of(o.sp_type, {"bpe", "unigram"}, "--sp-type");
  if (o.tokenizer == "bytes" && (o.vocab_size || !o.sp_model.empty()))
    throw UsageError("--vocab-size and --sp-model need --tokenizer sentencepiece");
  if (o.tokenizer == "sentencepiece" && o.sp_model.empty() && !o.vocab_size)
    throw UsageError("--vocab-size is required with --tokenizer sentencepiece (or give --sp-model FILE)");
  if (!o.sp_model.empty() && o.vocab_size) throw UsageError("--vocab-size cannot be combined with --sp-model");
  if (o.vocab_size > (1u << 30)) throw UsageError("--vocab-size: too large");
  if (!(o.val_fraction >= 0 && o.val_fraction <= 1)) throw UsageError("--val-fraction: must be in [0, 1]");
  if (o.shard_tokens == 0) throw UsageError("--shard-tokens: must be >= 1");
  if (o.threads < 0) throw UsageError("--threads: must be >= 0");
}

using clock::seconds_since;

void require_documents(const std::vector<Source>& sources, const PrepOptions& opt) {
  std::string first;
  if (DocReader(sources, opt).next(first)) return;
  std::string names;
  for (const auto& in : opt.inputs) names += (names.empty() ? "" : ", ") + (in == "-" ? "<stdin>" : in);
  throw DataError("no documents in the input (" + names + ")");
}

// The tokenizer: bytes, a given sentencepiece model, or one trained on a first pass over the input.
// A sentencepiece model is written into `dir` as kSpModelFile and its bytes kept in *model.
std::unique_ptr<Tokenizer> make_tokenizer(const std::vector<Source>& sources, const PrepOptions& opt,
                                          const std::string& dir, std::chrono::steady_clock::time_point t0,
                                          std::string* model) {
  if (opt.tokenizer == "bytes") return make_bytes_tokenizer();
  std::unique_ptr<Tokenizer> tok;
  if (!opt.sp_model.empty()) {
    *model = files::read_file(opt.sp_model);
    tok = sentencepiece_from_proto(*model, opt.sp_model);
  } else {
    DocReader reader(sources, opt);
    *model = train_sentencepiece({opt.sp_type, opt.vocab_size}, [&](std::string& d) { return reader.next(d); });
    tok = sentencepiece_from_proto(*model, kSpModelFile);
    if (!opt.quiet)
      log::info(strf("prep: trained sentencepiece %s, vocab %llu, in %.1f s", opt.sp_type.c_str(),
                     static_cast<unsigned long long>(opt.vocab_size), seconds_since(t0)));
  }
  files::write_file_atomic(dir + "/" + kSpModelFile, *model);
  return tok;
}

struct Totals {
  uint64_t docs = 0, tokens = 0, bytes = 0;
};

// The tokenizing pass, in rounds: read threads*4 batches, tokenize them in parallel, write them in
// reading order into the train and val shards.
Totals tokenize_all(const std::vector<Source>& sources, const PrepOptions& opt, const Tokenizer& tok, int threads,
                    SplitWriter& train, SplitWriter& val, Progress& progress) {
  DocReader reader(sources, opt);
  Totals n;
  for (bool more = true; more;) {
    std::vector<DocBatch> round;
    for (int b = 0; more && b < threads * kBatchesPerThread; ++b) {
      DocBatch batch;
      size_t bytes = 0;
      std::string doc;
      while (bytes < kBatchBytes && (more = reader.next(doc))) {
        bytes += doc.size();
        batch.docs.push_back(std::move(doc));
      }
      if (!batch.docs.empty()) round.push_back(std::move(batch));
    }
    parallel_for(round.size(), threads, [&](size_t i) {
      DocBatch& b = round[i];
      for (const auto& d : b.docs) {
        b.tokens.push_back(tok.encode(d));
        b.val.push_back(is_val_document(d, opt.split_seed, opt.val_fraction));
      }
    });
    for (const DocBatch& b : round) {
      for (size_t i = 0; i < b.docs.size(); ++i) {
        (b.val[i] ? val : train).add(b.tokens[i]);
        n.tokens += b.tokens[i].size();
      }
      n.docs += b.docs.size();
    }
    n.bytes = reader.bytes();
    progress.update(n.docs, n.tokens, n.bytes);
  }
  return n;
}

void log_summary(const PrepOptions& opt, const Manifest& m, const SplitWriter& train, const SplitWriter& val,
                 double seconds) {
  uint64_t val_docs = 0;
  for (const auto& s : val.shards()) val_docs += s.docs;
  log::info(strf("prep: wrote %s: train %zu shards / %llu tokens, val %zu shards / %llu tokens (%llu documents), "
                 "data version %s, %.1f s",
                 opt.out.c_str(), train.shards().size(), static_cast<unsigned long long>(m.split_tokens("train")),
                 val.shards().size(), static_cast<unsigned long long>(m.split_tokens("val")),
                 static_cast<unsigned long long>(val_docs), m.data_version.c_str(), seconds));
  if (val.shards().empty() && opt.val_fraction > 0) log::warn("prep: the val split is empty (too few documents)");
}

}  // namespace

Manifest run_prep(const PrepOptions& opt) {
  validate(opt);
  const int threads = opt.threads > 0 ? opt.threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const std::vector<Source> sources = expand_inputs(opt.inputs);
  StagingDir stage(opt.out);
  const auto t0 = std::chrono::steady_clock::now();
  require_documents(sources, opt);

  std::string model;
  const std::unique_ptr<Tokenizer> tok = make_tokenizer(sources, opt, stage.path(), t0, &model);
  Manifest m;
  m.tokenizer = tok->info();
  m.tokenizer.file = model.empty() ? "" : kSpModelFile;
  const TokenDtype dtype = dtype_for_vocab(m.tokenizer.vocab_size);
  m.dtype = dtype == TokenDtype::kU16 ? "uint16" : "uint32";

  SplitWriter train(stage.path(), "train", dtype, opt.shard_tokens), val(stage.path(), "val", dtype, opt.shard_tokens);
  Progress progress(opt.quiet);
  const Totals n = tokenize_all(sources, opt, *tok, threads, train, val, progress);
  train.close();
  val.close();

  m.shards = train.shards();
  m.shards.insert(m.shards.end(), val.shards().begin(), val.shards().end());
  m.data_version = compute_data_version(m.shards, m.tokenizer.hash);
  files::write_file_atomic(stage.path() + "/manifest.json", m.to_json());
  stage.commit();
  m.dir = opt.out;

  progress.update(n.docs, n.tokens, n.bytes, true);
  if (!opt.quiet) log_summary(opt, m, train, val, seconds_since(t0));
  return m;
}

std::vector<std::string> run_index(const PrepOptions& opt) {
  if (opt.inputs.empty()) throw UsageError("no INPUT given");
  if (opt.docs != "line" && opt.docs != "paragraph" && opt.docs != "jsonl")
    throw UsageError("--docs: '" + opt.docs + "' is not one of: line, paragraph, jsonl");
  if (opt.tokenizer == "sentencepiece" && opt.sp_model.empty())
    throw UsageError("prep index --tokenizer sentencepiece needs --sp-model FILE (the model the loader will use)");
  if (!(opt.val_fraction >= 0 && opt.val_fraction <= 1)) throw UsageError("--val-fraction: must be in [0, 1]");
  const int threads = opt.threads > 0 ? opt.threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const auto tok = opt.sp_model.empty() ? make_bytes_tokenizer() : load_sentencepiece(opt.sp_model);
  TextOptions t;
  t.docs = opt.docs, t.text_field = opt.text_field, t.val_fraction = opt.val_fraction, t.split_seed = opt.split_seed;
  std::vector<std::string> done;
  for (const auto& in : opt.inputs)
    for (const auto& file : list_text_files(in)) {
      const auto t0 = std::chrono::steady_clock::now();
      const TextIndex ix = TextIndex::build(file, t, *tok, threads);
      ix.save(file + ".lmidx");
      if (!opt.quiet)
      {
        uint64_t tokens = 0;
        for (const auto& d : ix.docs) tokens += d.tokens;
        const double s = seconds_since(t0);
        log::info(strf("prep index: %s.lmidx: %zu documents, %llu tokens, %zu chunks, %.2f s, %.0f tokens/s on %d "
                       "threads", file.c_str(), ix.docs.size(), static_cast<unsigned long long>(tokens), ix.chunks.size(),
                       s, tokens / std::max(s, 1e-9), threads));
      }
      done.push_back(file);
    }
  return done;
}

}  // namespace lm::data
