// `prep`: the command line over run_prep() (data/prep/prep.h). Exit 0 on success (and --help), 2 with
// one "prep: error: ..." line for bad options or input, 1 for other failures.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <iostream>
#include <string>
#include <thread>

#include "data/prep/prep.h"
#include "common/errors.h"

int main(int argc, char** argv) {
  return lm::run_main("prep", [&] {
    lm::data::PrepOptions o;
    o.threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    const bool index = argc > 1 && std::string(argv[1]) == "index";  // prep index FILE...: raw text indexes
    if (index) --argc, ++argv;
    // Digits only: CLI11 would wrap "-1" around into a huge unsigned value.
    const CLI::Validator unsigned_number(
        [](std::string& s) {
          return !s.empty() && s.find_first_not_of("0123456789") == std::string::npos
                     ? std::string()
                     : "expected an integer >= 0, got '" + s + "'";
        },
        "UINT");
    CLI::App app{index ? "prep index: the FILE.lmidx index the loader uses to read raw text (data.text)."
                       : "prep: text files to token shards (train/val), tokenizer model and manifest.json.\n"
                         "Shard and manifest formats: data/FORMAT.md. `prep index FILE...` indexes raw text instead."};
    app.add_option("INPUT", o.inputs, "Files, directories (recursive, files in path order), or - for stdin; required");
    app.add_option("-o,--out", o.out, "Output directory, replaced only when prep succeeds; required");
    app.add_option("--docs", o.docs, "One document per: line | paragraph (blank-line separated) | jsonl record")
        ->capture_default_str();
    app.add_option("--text-field", o.text_field, "JSONL field holding the document text")->capture_default_str();
    app.add_option("--tokenizer", o.tokenizer, "bytes (258 ids) | sentencepiece")->capture_default_str();
    app.add_option("--sp-type", o.sp_type, "Sentencepiece model to train: bpe | unigram")->capture_default_str();
    app.add_option("--vocab-size", o.vocab_size, "Sentencepiece vocabulary to train (required unless --sp-model)")
        ->check(unsigned_number);
    app.add_option("--sp-model", o.sp_model, "Existing sentencepiece .model to use instead of training");
    app.add_option("--shard-tokens", o.shard_tokens, "Target tokens per shard (documents are never split)")
        ->capture_default_str()->check(unsigned_number);
    app.add_option("--val-fraction", o.val_fraction, "Share of documents in the val split (by text hash)")
        ->capture_default_str();
    app.add_option("--split-seed", o.split_seed, "Seed of the document hash deciding the split")
        ->capture_default_str()->check(unsigned_number);
    app.add_option("--threads", o.threads, "Tokenizer threads (output does not depend on it)")
        ->capture_default_str()->check(CLI::Range(0, 4096));
    app.add_flag("-q,--quiet", o.quiet, "No progress on stderr");
    // INPUT and --out are checked by run_prep(), so that an unknown option is reported first.
    try {
      app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
      if (e.get_exit_code() == 0) return app.exit(e);  // --help
      throw lm::UsageError(e.what());
    }
    if (index) lm::data::run_index(o);
    else lm::data::run_prep(o);
    return 0;
  });
}
