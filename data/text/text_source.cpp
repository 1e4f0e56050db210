// Raw text as a dataset: chunks tokenized on demand and ahead, kept in memory (see text_source.h).
#include "data/text/text_source.h"

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <exception>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <thread>

#include "common/checksum.h"
#include "common/errors.h"
#include "common/files.h"
#include "common/log.h"
#include "data/format/shard.h"
#include "data/tokenizer/tokenizer.h"

namespace lm::data {
namespace {

struct ChunkRef {
  std::shared_ptr<const TextIndex> index;
  size_t chunk = 0;
};

class TextSource : public ShardSource {
 public:
  // `val`: the val split's chunks in order. Evaluation reads them on the training thread, so they
  // are only ever tokenized by the threads ahead: the first at once, each next one when evaluation
  // opens the one before it, and one evaluation opens before it is ready is queued first and
  // waited for. Val chunks, once tokenized, are never evicted.
  // `threads` tokenize ahead, each taking the next chunk of the list that nobody is building.
  // `model`: the tokenizer's model file ("" for bytes).
  TextSource(std::string location, const TextOptions& o, std::shared_ptr<const Tokenizer> tok, std::string model,
             std::map<std::string, ChunkRef> chunks, std::vector<std::string> val, int threads)
      : location_(std::move(location)), model_(std::move(model)), opt_(o), tok_(std::move(tok)), chunks_(std::move(chunks)),
        dtype_(dtype_for_vocab(tok_->info().vocab_size)), val_(std::move(val)) {
    if (!val_.empty()) val_queue_.push_back(val_.front());
    for (int i = 0; i < std::max(threads, 1); ++i) threads_.emplace_back([this] { run_ahead(); });
  }

  ~TextSource() override {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
  }

  std::string location() const override { return location_; }
  std::string kind() const override { return "text"; }
  // Raw text has one file of its own besides the text: the tokenizer's model (data.tokenizer).
  std::string read_file(const std::string& name) override {
    if (model_.empty() || name != tok_->info().file) throw DataError(location_ + ": raw text has no file '" + name + "'");
    return files::read_file(model_);
  }
  std::string fetch(const ShardInfo& s, std::shared_ptr<const void>*) override {
    throw Error(s.file + ": a raw text chunk has no shard file");
  }
  void verify(const ShardInfo&) override {}  // open() checks every chunk it tokenizes
  void reserve(size_t shards, const std::string&) override {
    std::lock_guard<std::mutex> lk(mu_);
    capacity_ = std::max<size_t>(shards + 1, 2);
  }
  void ahead(const std::vector<ShardInfo>& next) override {
    std::lock_guard<std::mutex> lk(mu_);
    std::vector<std::string> names;
    for (const auto& s : next) names.push_back(s.file);
    if (names == ahead_) return;
    ahead_ = std::move(names);
    ++generation_;
    cv_.notify_all();
  }

  std::unique_ptr<ShardReader> open(const ShardInfo& s) override {
    if (is_val(s.file)) return std::make_unique<ShardReader>(s.file, get_val(s.file));
    return std::make_unique<ShardReader>(s.file, get(s.file, /*wait=*/true));
  }

 private:
  struct Entry {
    std::shared_ptr<const MemoryShard> shard;  // null while being built
    uint64_t used = 0;
  };

  // The chunk tokenized: by this thread, or by the one already at it. wait=false (the thread
  // ahead): null when another thread builds it. keep_error (a queued val chunk): a failure is kept
  // for the reader waiting for it (get_val) and null returned.
  std::shared_ptr<const MemoryShard> get(const std::string& name, bool wait, bool keep_error = false) {
    std::unique_lock<std::mutex> lk(mu_);
    for (;;) {
      auto it = cache_.find(name);
      if (it == cache_.end()) break;
      if (it->second.shard) {
        it->second.used = ++clock_;
        return it->second.shard;
      }
      if (!wait) return nullptr;
      cv_.wait(lk);
    }
    cache_[name].used = ++clock_;  // null: being built
    lk.unlock();
    std::shared_ptr<const MemoryShard> shard;
    try {
      shard = build(name);
    } catch (...) {
      lk.lock();
      cache_.erase(name);
      if (keep_error) val_errors_[name] = std::current_exception();
      cv_.notify_all();
      if (keep_error) return nullptr;
      throw;
    }
    lk.lock();
    cache_[name].shard = shard;
    evict();
    cv_.notify_all();
    return shard;
  }

  // A val chunk, tokenized by a thread ahead (queued first when nobody builds it yet); the next
  // val chunk is queued behind it.
  std::shared_ptr<const MemoryShard> get_val(const std::string& name) {
    std::unique_lock<std::mutex> lk(mu_);
    const auto at = std::find(val_.begin(), val_.end(), name);
    if (at != val_.end()) queue_val(val_[static_cast<size_t>(at - val_.begin() + 1) % val_.size()], /*first=*/false);
    for (;;) {
      if (auto it = cache_.find(name); it != cache_.end() && it->second.shard) {
        it->second.used = ++clock_;
        return it->second.shard;
      }
      if (auto e = val_errors_.find(name); e != val_errors_.end()) {
        const std::exception_ptr err = e->second;
        val_errors_.erase(e);  // the next open tries again
        std::rethrow_exception(err);
      }
      if (!cache_.count(name)) queue_val(name, /*first=*/true);
      cv_.wait(lk);
    }
  }
  // Queues a val chunk for the threads ahead unless it is built or being built (mu_ held); `first`:
  // at the front (a reader waits for it).
  void queue_val(const std::string& name, bool first) {
    if (cache_.count(name)) return;
    const auto queued = std::find(val_queue_.begin(), val_queue_.end(), name);
    if (queued != val_queue_.end()) {
      if (!first) return;
      val_queue_.erase(queued);
    }
    if (first) val_queue_.push_front(name);
    else val_queue_.push_back(name);
    cv_.notify_all();
  }

  bool is_val(const std::string& name) const {
    const ChunkRef& r = chunks_.at(name);
    return r.index->chunks[r.chunk].val;
  }

  // Drops the least recently used train chunks beyond the capacity, those not wanted ahead first
  // (val chunks stay: evaluation reads the same ones every time).
  void evict() {
    const std::set<std::string> wanted(ahead_.begin(), ahead_.end());
    for (;;) {
      size_t train = 0;
      auto victim = cache_.end();
      auto rank = [&](const auto& it) { return std::make_pair(wanted.count(it->first) > 0, it->second.used); };
      for (auto it = cache_.begin(); it != cache_.end(); ++it) {
        if (is_val(it->first)) continue;
        ++train;
        if (it->second.shard && (victim == cache_.end() || rank(it) < rank(victim))) victim = it;
      }
      if (train <= capacity_ || victim == cache_.end()) return;
      cache_.erase(victim);
    }
  }

  // Reads the chunk's documents again, checks them against the index and tokenizes them.
  std::shared_ptr<const MemoryShard> build(const std::string& name) const {
    const ChunkRef& ref = chunks_.at(name);
    const TextIndex& ix = *ref.index;
    const TextChunk& c = ix.chunks[ref.chunk];
    ShardWriter w(name, dtype_);
    std::vector<uint64_t> hashes;
    std::vector<uint32_t> ids;
    DocSplitter split(opt_.docs, opt_.text_field, ix.path);
    TextDoc d;
    auto add = [&] {
      if (is_val_document(d.text, opt_.split_seed, opt_.val_fraction) != c.val) return;
      ids = tok_->encode(d.text);
      w.add_document(ids.data(), ids.size());
      hashes.push_back(doc_text_hash(d.text));
    };
    for_each_line(ix.path, ix.docs[c.first_doc].begin, ix.docs[c.last_doc].end, ix.frames,
                  [&](std::string_view line, uint64_t at, uint64_t end) {
                    if (split.line(line, at, end, &d)) add();
                  });
    if (split.finish(&d)) add();
    if (w.num_docs() != c.docs || w.num_tokens() != c.tokens || xxh64(hashes.data(), hashes.size() * 8) != c.xxh64)
      throw DataError(strf("%s: the documents in bytes [%llu, %llu) differ from its index (%s): the file changed "
                           "without changing its size and time; delete the index to rebuild it", ix.path.c_str(),
                           static_cast<unsigned long long>(ix.docs[c.first_doc].begin),
                           static_cast<unsigned long long>(ix.docs[c.last_doc].end), name.c_str()));
    return w.finish_in_memory();
  }

  // The thread ahead: tokenizes the queued val chunks first, then the chunks of the latest ahead()
  // list, in order, while they fit.
  void run_ahead() {
    std::unique_lock<std::mutex> lk(mu_);
    uint64_t done = 0;
    for (;;) {
      cv_.wait(lk, [&] { return stop_ || generation_ != done || !val_queue_.empty(); });
      if (stop_) return;
      if (!val_queue_.empty()) {
        const std::string name = val_queue_.front();
        val_queue_.pop_front();
        lk.unlock();
        get(name, /*wait=*/false, /*keep_error=*/true);
        lk.lock();
        done = 0;  // then the list ahead again (generation_ >= 1 once there is one), where it stopped
        continue;
      }
      done = generation_;
      const std::vector<std::string> list = ahead_;
      const size_t room = capacity_;
      lk.unlock();
      for (size_t i = 0; i < list.size() && i + 1 < room; ++i) {
        if (interrupted(done)) break;
        try {
          get(list[i], /*wait=*/false);
        } catch (const std::exception& e) {  // the reader that needs it meets the same error
          log::warn(std::string("text source: tokenizing ahead: ") + e.what());
          break;
        }
      }
      lk.lock();
    }
  }
  // Stop, a new ahead() list, or a val chunk to tokenize first.
  bool interrupted(uint64_t done) const {
    std::lock_guard<std::mutex> lk(mu_);
    return stop_ || generation_ != done || !val_queue_.empty();
  }

  std::string location_, model_;
  TextOptions opt_;
  std::shared_ptr<const Tokenizer> tok_;
  std::map<std::string, ChunkRef> chunks_;
  TokenDtype dtype_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, Entry> cache_;
  std::vector<std::string> ahead_;
  const std::vector<std::string> val_;                      // the val chunks in order
  std::deque<std::string> val_queue_;                       // val chunks to tokenize, before the list ahead
  std::map<std::string, std::exception_ptr> val_errors_;  // why a queued val chunk failed, for its reader
  uint64_t generation_ = 0, clock_ = 0;
  size_t capacity_ = 4;
  bool stop_ = false;
  std::vector<std::thread> threads_;  // last: started when everything above exists
};

}  // namespace

Manifest open_text_dataset(const std::string& location, const std::string& key, const TextSourceOptions& o) {
  if (o.text.docs != "line" && o.text.docs != "paragraph" && o.text.docs != "jsonl")
    throw ConfigError("key '" + key + "': raw text needs docs line, paragraph or jsonl, got '" + o.text.docs + "'");
  if (o.tokenizer != "bytes" && !std::filesystem::is_regular_file(o.tokenizer) && !files::exists(o.tokenizer + "/manifest.json"))
    throw ConfigError("key 'data.tokenizer': '" + o.tokenizer + "' is neither bytes, a sentencepiece .model file nor a "
                      "prep output directory");
  std::shared_ptr<const Tokenizer> tok = o.load_tokenizer ? o.load_tokenizer(o.tokenizer) : load_tokenizer_isolated(o.tokenizer);
  const int threads = o.threads > 0 ? o.threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  Manifest m;
  m.dir = location;
  m.tokenizer = tok->info();
  m.dtype = dtype_for_vocab(m.tokenizer.vocab_size) == TokenDtype::kU16 ? "uint16" : "uint32";
  std::map<std::string, ChunkRef> chunks;
  std::vector<ShardInfo> val;
  for (const auto& file : list_text_files(location)) {
    auto ix = std::make_shared<const TextIndex>(text_index(file, o.text, *tok, o.cache_dir, threads));
    size_t k[2] = {0, 0};
    for (size_t i = 0; i < ix->chunks.size(); ++i) {
      const TextChunk& c = ix->chunks[i];
      ShardInfo s;
      s.split = c.val ? "val" : "train";
      s.file = file + "#" + s.split + std::to_string(k[c.val]++);
      s.tokens = c.tokens, s.docs = c.docs, s.xxh64 = hex64(c.xxh64);
      (c.val ? val : m.shards).push_back(s);
      chunks[s.file] = {ix, i};
    }
  }
  m.shards.insert(m.shards.end(), val.begin(), val.end());
  if (m.split_tokens("train") == 0) throw DataError(location + ": no documents in the train split");
  m.data_version = compute_data_version(m.shards, m.tokenizer.hash);
  std::vector<std::string> val_names;
  for (const auto& s : val) val_names.push_back(s.file);
  std::string model;  // the tokenizer's model file: data.tokenizer, or the one of the prep output it names
  if (!m.tokenizer.file.empty())
    model = std::filesystem::is_regular_file(o.tokenizer) ? o.tokenizer : o.tokenizer + "/" + Manifest::load(o.tokenizer).tokenizer.file;
  m.source = std::make_shared<TextSource>(location, o.text, tok, std::move(model), std::move(chunks), std::move(val_names),
                                          o.ahead_threads);
  return m;
}

}  // namespace lm::data
