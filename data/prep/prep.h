// prep: text to a prepared dataset directory (token shards, tokenizer model, manifest.json; the
// layout is in data/format/FORMAT.md). `build/bin/prep` is a thin command line over run_prep().
//
// Contract: the same inputs and options give a byte-identical directory, whatever `threads` is.
// OUT is built as "OUT.tmp.<pid>" next to it (manifest.json written last) and swapped into place
// only on success; on any error the temp directory is removed and an existing OUT is untouched.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "data/format/manifest.h"
#include "data/text/documents.h"  // is_val_document(), the documents prep reads

namespace lm::data {

struct PrepOptions {
  std::vector<std::string> inputs;   // files, directories (recursive, files in path order), "-" = stdin
  std::string out;                   // output directory; required
  std::string docs = "line";         // one document per: "line" | "paragraph" (blank-line separated) | "jsonl" record
  std::string text_field = "text";   // JSONL field holding the document text
  std::string tokenizer = "bytes";   // "bytes" | "sentencepiece"
  std::string sp_type = "bpe";       // sentencepiece model to train: "bpe" | "unigram"
  uint64_t vocab_size = 0;           // sentencepiece vocabulary to train; required unless sp_model
  std::string sp_model;              // existing sentencepiece .model to use instead of training
  uint64_t shard_tokens = 100000000; // target tokens per shard (documents are never split)
  double val_fraction = 0.01;        // share of documents in the val split, decided per document
  uint64_t split_seed = 0;           // seed of the xxh64 document hash that decides the split
  int threads = 0;                   // tokenizer threads; 0 = hardware concurrency
  bool quiet = false;                // no progress on stderr
};

// Runs prep and returns the manifest it wrote to opt.out. Bad options throw UsageError naming the
// option; bad input throws DataError naming the file (and FILE:LINE for JSONL records). Blank lines
// (only spaces/tabs) separate or are skipped, never documents; trailing '\r' is dropped; stdin and
// other non-regular inputs are read into memory once.
Manifest run_prep(const PrepOptions& opt);

// `prep index`: for each text file of opt.inputs (files or directories), the index the loader needs
// to read it as raw text (data/text/text_index.h), written next to it as FILE.lmidx. Uses inputs,
// docs, text_field, tokenizer (bytes, or sentencepiece with sp_model), val_fraction, split_seed and
// threads. Returns the files indexed.
std::vector<std::string> run_index(const PrepOptions& opt);

}  // namespace lm::data
