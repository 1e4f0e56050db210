// Raw text as a dataset: text or JSONL files (or their .zst forms) that the loader tokenizes as it
// reads, with the same documents, tokens and splits `prep` would write for them.
//
// Each file's index (text_index.h) gives its chunks, which stand for the shards of a prepared
// dataset in the manifest (file "PATH#train3", "PATH#val0"; the checksum covers the chunk's
// document texts); everything above the Manifest is unchanged: the plan, the two-stage shuffle,
// mixtures, the cursor in checkpoints (chunk, document, token), exact resume. A chunk is tokenized
// when first needed, by the thread that needs it (a loader worker) or ahead of need by the
// source's own threads in the order the plan will read (ShardSource::ahead). The val split's chunks,
// which evaluation reads on the training thread, are tokenized by the source's own threads only
// (the first at once, each next one when the one before it is opened; one opened before it is
// ready is tokenized first and waited for), so the training thread never tokenizes. Tokenized
// chunks are kept in memory, as many as the plan needs at hand (val chunks: all that were read).
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "data/format/manifest.h"
#include "data/text/text_index.h"

namespace lm::data {

struct TextSourceOptions {
  TextOptions text;
  std::string tokenizer = "bytes";  // "bytes", a sentencepiece .model file, or a prep output directory
  std::string cache_dir;            // where indexes built on open are kept (CACHE/text-index/)
  int threads = 0;                  // index building; 0 = hardware concurrency
  int ahead_threads = 2;            // threads tokenizing chunks ahead of need (the loader: data.workers)
  // Loads `tokenizer`; null: load_tokenizer_isolated (the plugin, for processes with LibTorch).
  // Processes linking lm_tok (prep, tests; sanitizer builds, where RTLD_DEEPBIND cannot work) load directly.
  std::function<std::unique_ptr<Tokenizer>(const std::string&)> load_tokenizer;
};

// The raw text at `location` (a file, or a directory of files in path order) as a dataset; `key`
// names the config key in messages. Indexes are read or built here (on `threads` threads).
// Throws DataError naming the file (FILE:LINE for bad JSONL) or the tokenizer.
Manifest open_text_dataset(const std::string& location, const std::string& key, const TextSourceOptions& o);

}  // namespace lm::data
