// Data mixtures in the loader (data/loader/mix.h): exact resume at every batch boundary of a
// 3-source mixture (packed and bucketed, 1 and 3 workers, 2 ranks), a weight edit at a resume
// audited against the documents read (from the batches' tokens) and each source's own stream, token
// shares within one sequence of the weights, stages by step and by tokens, a tiny source that wraps
// and is capped, the refused inputs and changes, and an appended source's exact share.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <tuple>

#include "common/checksum.h"
#include "common/errors.h"
#include "common/files.h"
#include "common/log.h"
#include "data/format/manifest.h"
#include "data/format/shard.h"
#include "data/loader/loader.h"
#include "tests/testutil.h"

namespace lm::data {
namespace {

using test::data_error;
using test::TempDir;
constexpr int64_t kT = 8;  // seq_len
constexpr int W = 2;       // ranks

// A prepared (not raw text) source of the mixture.
SourceConfig source(const std::string& name, const std::string& path, double weight) {
  SourceConfig c;
  c.name = name, c.path = path, c.weight = weight;
  return c;
}

// The first token id of a source made with `seed`: sources of one test own disjoint id ranges, so a
// token names its source (ids < 99998, the EOS and pad ids).
uint32_t first_id(unsigned seed) { return 1 + 12000 * (seed % 8); }

// A prepared source under DIR/NAME: `shards` train shards of random documents of 1..3*kT tokens
// (token ids consecutive from first_id(seed), so every id is unique within the source and names it)
// and a val shard. `tok` names the tokenizer (its hash). `train_docs`: the train documents' lengths,
// in shard order.
Manifest make_source(const std::string& root, const std::string& name, std::vector<int> docs_per_shard, unsigned seed,
                     const std::string& tok = "bytes", std::vector<uint32_t>* train_docs = nullptr) {
  const std::string dir = root + "/" + name;
  files::make_dirs(dir);
  Manifest m;
  m.dtype = "uint32";
  m.tokenizer = {"sentencepiece", 100000, 99998, 99999, "", hex64(xxh64(tok.data(), tok.size()))};
  std::mt19937 g(seed);
  uint32_t next = first_id(seed);
  docs_per_shard.push_back(1);  // val
  for (size_t i = 0; i < docs_per_shard.size(); ++i) {
    const bool val = i + 1 == docs_per_shard.size();
    ShardInfo s{(val ? "val_" : "train_") + std::to_string(i) + ".bin", val ? "val" : "train", 0, 0, ""};
    ShardWriter w(dir + "/" + s.file, TokenDtype::kU32);
    for (int d = 0; d < docs_per_shard[i]; ++d) {
      std::vector<uint32_t> doc(1 + g() % (3 * kT));
      for (auto& t : doc) t = next++;
      if (!val && train_docs) train_docs->push_back(static_cast<uint32_t>(doc.size()));
      w.add_document(doc.data(), doc.size());
      s.tokens += doc.size(), ++s.docs;
    }
    s.xxh64 = hex64(w.finish());
    m.shards.push_back(s);
  }
  m.data_version = compute_data_version(m.shards, m.tokenizer.hash);
  files::write_file_atomic(dir + "/manifest.json", m.to_json());
  return Manifest::load(dir);
}

struct Mix {
  TempDir tmp;
  DataConfig cfg;
  std::vector<Manifest> manifests;
  std::vector<std::vector<uint32_t>> docs{3};  // per source: its train documents' lengths
  std::vector<unsigned> seeds{1, 2, 3};
  Mix(const std::string& mode, int64_t workers) {
    cfg.mode = mode;
    cfg.workers = workers;
    cfg.shuffle_buffer = 16;
    manifests = {make_source(tmp.path(), "web", {30, 20}, 1, "bytes", &docs[0]),
                 make_source(tmp.path(), "code", {25}, 2, "bytes", &docs[1]),
                 make_source(tmp.path(), "tiny", {4}, 3, "bytes", &docs[2])};
    cfg.sources = {source("web", manifests[0].dir, 5), source("code", manifests[1].dir, 3), source("tiny", manifests[2].dir, 2)};
  }
};

// One global batch: every rank's batch.
using Global = std::vector<Batch>;

struct Ranks {
  std::vector<std::unique_ptr<Loader>> l;
  Ranks(const DataConfig& c, const std::vector<Manifest>& m, int64_t B, int world, const std::string& from = "",
        bool force = false, int64_t accum = 1) {
    for (int r = 0; r < world; ++r) {
      l.push_back(std::make_unique<Loader>(c, m, "train", kT, B, r, world, 9, accum));
      if (!from.empty()) l.back()->load_state(LoaderState::from_json(from), force);
    }
  }
  Global next() {
    Global g;
    for (auto& x : l) g.push_back(x->next());
    return g;
  }
  std::string state() const {
    const std::string s = l[0]->state().to_json();
    for (auto& x : l) EXPECT_EQ(x->state().to_json(), s) << "ranks agree on the state";
    return s;
  }
};

void expect_same(const Global& a, const Global& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t r = 0; r < a.size(); ++r) {
    EXPECT_EQ(a[r].hash, b[r].hash) << what << " rank " << r;
    EXPECT_TRUE(a[r].inputs == b[r].inputs && a[r].origins == b[r].origins) << what << " rank " << r;
    EXPECT_EQ(a[r].source_tokens, b[r].source_tokens) << what;
  }
}

TEST(MixTest, ExactResumeAtEveryBatchBoundary) {
  for (const std::string mode : {"packed", "bucketed"})
    for (int64_t workers : {1, 3}) {
      Mix mix(mode, workers);
      Ranks full(mix.cfg, mix.manifests, 3, W);
      std::vector<Global> ref;
      std::vector<std::string> states{full.state()};
      for (int k = 0; k < 40; ++k) ref.push_back(full.next()), states.push_back(full.state());
      for (size_t k = 0; k < ref.size(); ++k) {
        Ranks resumed(mix.cfg, mix.manifests, 3, W, states[k]);
        for (size_t i = k; i < std::min(ref.size(), k + 4); ++i)
          expect_same(resumed.next(), ref[i], mode + " workers " + std::to_string(workers) + " resumed after " + std::to_string(k));
        ASSERT_FALSE(::testing::Test::HasFailure());
      }
      // The same stream whatever the worker count and rank count (one rank of 2*3 rows), also when
      // the world size changes at a resume (after batch 17).
      auto key = [](const SampleOrigin& o) { return std::make_tuple(o.source, o.shard, o.doc, o.offset); };
      auto sorted = [&](std::vector<SampleOrigin> v) {
        std::sort(v.begin(), v.end(), [&](const auto& x, const auto& y) { return key(x) < key(y); });
        return v;
      };
      auto check = [&](Ranks& one, size_t from, const std::string& what) {
        for (size_t k = from; k < ref.size(); ++k) {
          const Batch b = one.next()[0];
          std::vector<SampleOrigin> both;
          for (const Batch& x : ref[k]) both.insert(both.end(), x.origins.begin(), x.origins.end());
          EXPECT_TRUE(sorted(both) == sorted(b.origins)) << mode << ": 2 ranks x 3 rows == 1 rank x 6 rows, " << what;
          EXPECT_EQ(b.source_tokens, ref[k][0].source_tokens);
        }
      };
      Ranks one(mix.cfg, mix.manifests, 3 * W, 1);
      check(one, 0, "from the start");
      Ranks shrunk(mix.cfg, mix.manifests, 3 * W, 1, states[17]);
      check(shrunk, 17, "resumed with world size 1");
    }
}

// Each source's samples, in order of consumption, as that source's own stream gives them (a
// one-source mixture of it alone, same name and seed) must be a prefix: the multiset of the first n.
void audit_against_own_stream(const Mix& mix, size_t s, const std::vector<SampleOrigin>& got) {
  DataConfig one = mix.cfg;
  one.token_budget = 0;  // the source's own stream, one sample at a time
  one.sources = {mix.cfg.sources[s]};
  one.stages.clear();
  Loader own(one, {mix.manifests[s]}, "train", kT, 1, 0, 1, 9, 1);
  std::map<std::tuple<uint64_t, uint64_t, uint64_t>, int> want, have;
  for (size_t i = 0; i < got.size(); ++i) {
    const SampleOrigin o = own.next().origins.at(0);
    ++want[{o.shard, o.doc, o.offset}];
    ++have[{got[i].shard, got[i].doc, got[i].offset}];
  }
  EXPECT_TRUE(want == have) << "source " << mix.cfg.sources[s].name << ": " << got.size()
                            << " samples are not its stream's first ones (a repeat or a skip)";
}

// The documents actually read, audited from the batches' tokens alone (not the planner's origins,
// not its stream): a token id names its source and a train document is known by its first token.
// Per source, E = the epochs its reading started, from the documents alone: packed, an epoch is
// floor((L-1)/T)*T target tokens (L = the tokens plus one EOS per document); bucketed, one sample
// per document. No document may be read more than E times (a repeat within an epoch) or fewer than
// E-1 times (a skip), except, packed, the tail of fewer than T tokens that each epoch leaves unread
// (loader.h): at most T/2 documents per epoch.
void audit_against_documents(const Mix& mix, const std::vector<Global>& run, const std::string& what) {
  const bool packed = mix.cfg.mode == "packed";
  const size_t S = mix.docs.size();
  std::vector<std::map<int64_t, size_t>> first(S);  // per source: first token id -> document
  std::vector<int64_t> lo(S), hi(S), L(S, 0);
  for (size_t s = 0; s < S; ++s) {
    int64_t id = lo[s] = first_id(mix.seeds[s]);
    for (size_t d = 0; d < mix.docs[s].size(); ++d) first[s][id] = d, id += mix.docs[s][d], L[s] += mix.docs[s][d] + 1;
    hi[s] = id;
  }
  auto source_of = [&](int64_t id) {
    for (size_t s = 0; s < S; ++s)
      if (id >= lo[s] && id < hi[s]) return s;
    return S;
  };
  std::vector<std::vector<int64_t>> reads(S);
  std::vector<int64_t> targets(S, 0), rows(S, 0);
  for (size_t s = 0; s < S; ++s) reads[s].assign(mix.docs[s].size(), 0);
  for (const Global& g : run)
    for (const Batch& b : g)
      for (int64_t r = 0; r < b.rows; ++r) {
        size_t src = S;
        for (int64_t t = 0; t < b.cols; ++t) {
          const int64_t id = b.inputs[r * b.cols + t];
          const size_t s = source_of(id);
          if (s == S) continue;  // EOS, padding
          if (src == S) src = s;
          ASSERT_EQ(s, src) << what << ": a row holds tokens of two sources";
          auto it = first[s].find(id);
          if (it != first[s].end()) ++reads[s][it->second];
        }
        ASSERT_NE(src, S) << what << ": a row without a document token";
        ++rows[src];
        for (int64_t t = 0; t < b.cols; ++t) targets[src] += b.targets[r * b.cols + t] != -1;
      }
  for (size_t s = 0; s < S; ++s) {
    const std::string name = mix.cfg.sources[s].name;
    const int64_t per_epoch = packed ? (L[s] - 1) / kT * kT : static_cast<int64_t>(mix.docs[s].size());
    const int64_t used = packed ? targets[s] : rows[s];
    const int64_t E = (used + per_epoch - 1) / per_epoch;
    int64_t skipped = 0, total = 0;
    for (size_t d = 0; d < reads[s].size(); ++d) {
      EXPECT_LE(reads[s][d], E) << what << ": source '" << name << "' document " << d << " read " << reads[s][d]
                                << " times in " << E << " epochs (a repeat within an epoch)";
      skipped += reads[s][d] < E - 1;
      total += reads[s][d];
    }
    if (packed) {
      EXPECT_LE(skipped, E * kT / 2) << what << ": source '" << name << "': " << skipped << " documents skipped";
    } else {
      EXPECT_EQ(skipped, 0) << what << ": source '" << name << "': " << skipped << " documents skipped";
      EXPECT_EQ(total, rows[s]) << what << ": source '" << name << "': one document per bucketed row";
    }
    EXPECT_GT(total, 0) << what << ": source '" << name << "' was read";
  }
}

// Per batch: tokens per source from the rows equal Batch::source_tokens; each source's share of the
// segment's tokens stays within one sequence of its weight.
void check_shares(const std::vector<Global>& run, const std::vector<double>& w, size_t from, size_t to, const std::string& what) {
  std::vector<double> seg(w.size(), 0);
  double total = 0, worst = 0;
  for (size_t k = from; k < to; ++k) {
    for (size_t s = 0; s < w.size(); ++s) seg[s] += run[k][0].source_tokens[s], total += run[k][0].source_tokens[s];
    for (size_t s = 0; s < w.size(); ++s) worst = std::max(worst, std::abs(seg[s] - w[s] * total));
  }
  EXPECT_LE(worst, kT + 1) << what << ": a source's tokens left its target by more than one sequence";
  EXPECT_GT(total, 0);
}

TEST(MixTest, WeightEditAtResumeNeitherRepeatsNorSkips) {
  for (const std::string mode : {"packed", "bucketed"}) {
    Mix mix(mode, 2);
    mix.cfg.sources[2].weight = 0.5;
    std::vector<Global> run;
    Ranks before(mix.cfg, mix.manifests, 2, W);
    for (int k = 0; k < 30; ++k) run.push_back(before.next());
    const std::string state = before.state();
    DataConfig edited = mix.cfg;
    edited.sources[0].weight = 1, edited.sources[1].weight = 6, edited.sources[2].weight = 1;
    Ranks after(edited, mix.manifests, 2, W, state);
    for (int k = 0; k < 40; ++k) run.push_back(after.next());
    check_shares(run, {5 / 8.5, 3 / 8.5, 0.5 / 8.5}, 0, 30, mode + " before the edit");
    check_shares(run, {1 / 8.0, 6 / 8.0, 1 / 8.0}, 30, run.size(), mode + " after the edit");
    std::vector<std::vector<SampleOrigin>> per(3);
    for (const Global& g : run) {
      std::vector<int64_t> tokens(3, 0);
      for (const Batch& b : g)
        for (int64_t r = 0; r < b.rows; ++r) {
          per[b.origins[r].source].push_back(b.origins[r]);
          for (int64_t t = 0; t < b.cols; ++t) tokens[b.origins[r].source] += b.targets[r * b.cols + t] != -1;
        }
      EXPECT_EQ(tokens, g[0].source_tokens) << mode << ": source_tokens counts the rows of every rank";
    }
    for (size_t s = 0; s < 3; ++s) audit_against_own_stream(mix, s, per[s]);
    audit_against_documents(mix, run, mode + ", weights edited at batch 30");
    // The tiny source (4 docs) wrapped several times at weight 1/8.
    EXPECT_GT(per[2].size(), 4 * 2u) << mode;
  }
}

// Bucketed with a token budget: every rank's batch fits the budget (rows x padded length), ranks
// get equal rows, a resume at every boundary continues exactly, no sample repeats or is skipped,
// and the shares stay within one sequence.
TEST(MixTest, TokenBudgetBatchesFitResumeAndKeepTheShares) {
  Mix mix("bucketed", 2);
  mix.cfg.token_budget = 3 * kT;
  mix.cfg.pad_multiple = 2;
  std::vector<Global> run;
  std::vector<std::string> states;
  Ranks full(mix.cfg, mix.manifests, 1, W);
  for (int k = 0; k < 40; ++k) states.push_back(full.state()), run.push_back(full.next());
  std::vector<std::vector<SampleOrigin>> per(3);
  bool several = false;
  for (const Global& g : run) {
    EXPECT_EQ(g[0].rows, g[1].rows);
    EXPECT_TRUE(g[0].rows == 1 || g[0].rows * g[0].cols <= mix.cfg.token_budget) << g[0].rows << " x " << g[0].cols;
    several = several || g[0].rows > 1;
    for (const Batch& b : g)
      for (int64_t r = 0; r < b.rows; ++r) per[b.origins[r].source].push_back(b.origins[r]);
  }
  EXPECT_TRUE(several) << "the budget holds several rows";
  check_shares(run, {0.5, 0.3, 0.2}, 0, run.size(), "token budget");
  for (size_t s = 0; s < 3; ++s) audit_against_own_stream(mix, s, per[s]);
  audit_against_documents(mix, run, "token budget");
  for (size_t k = 0; k < run.size(); k += 3) {
    Ranks resumed(mix.cfg, mix.manifests, 1, W, states[k]);
    for (size_t i = k; i < std::min(run.size(), k + 3); ++i) expect_same(resumed.next(), run[i], "budget, resumed at " + std::to_string(k));
  }
}

TEST(MixTest, StagesSwitchAtTheirStep) {
  Mix mix("packed", 2);
  mix.cfg.stages = {{5, 0, {{"web", 1}}}, {0, 0, {{"code", 1}, {"tiny", 1}}}};
  Ranks l(mix.cfg, mix.manifests, 2, 1, "", false, /*accum=*/2);  // stage 1 ends at step 5 = batch 10
  for (int k = 0; k < 20; ++k) {
    const auto st = l.next()[0].source_tokens;
    if (k < 10) {
      EXPECT_TRUE(st[1] == 0 && st[2] == 0) << "batch " << k;
    } else {
      EXPECT_EQ(st[0], 0) << "batch " << k;
    }
  }
}

// A stage that ends by tokens: it runs while the tokens before the batch are under until_tokens
// (2 rows x kT = 16 target tokens per packed batch: 48 tokens end it after batch 2, the third).
TEST(MixTest, StagesSwitchAtTheirTokens) {
  Mix mix("packed", 2);
  mix.cfg.stages = {{0, 48, {{"web", 1}}}, {0, 0, {{"code", 1}, {"tiny", 1}}}};
  Ranks l(mix.cfg, mix.manifests, 2, 1);
  int64_t tokens = 0;
  for (int k = 0; k < 8; ++k) {
    const auto st = l.next()[0].source_tokens;
    if (tokens < 48) {
      EXPECT_EQ(st[0], 2 * kT) << "batch " << k << " (" << tokens << " tokens before it): stage 1, web alone";
    } else {
      EXPECT_EQ(st[0], 0) << "batch " << k << ": stage 2";
      EXPECT_EQ(st[1], kT) << "batch " << k << ": stage 2, code and tiny half and half";
      EXPECT_EQ(st[2], kT) << "batch " << k;
    }
    tokens += st[0] + st[1] + st[2];
    EXPECT_EQ(tokens, (k + 1) * 2 * kT);
  }
}

// Step blocks (dist.invariant) over a mixture in stages (the first ends at 100 tokens: inside step 2
// of 64 tokens a step, where a stage decided per call would switch at a world size's own batch),
// G = 4 micro-batches of 2 rows a step at world sizes 1, 2 and 4 (grad_accum 4, 2, 1), packed and
// bucketed: rank r's k-th call is global micro-batch r*A + k, and each step's global micro-batches
// have the same rows, tokens and hash at every world size, also across a cut at 2 ranks resumed at
// 4; the ranks' calls' source tokens add up to the step's; the stage switches at step 3 (tokens
// 128 before it) at every world size. Checked to fail with the MixPlanner given no step blocks
// (form.cpp): the 1-rank stream switches inside step 2 and the ranks' rows are dealt per call.
TEST(MixTest, StepBlocksDealTheSameMicroBatchesAtAnyWorldSize) {
  for (const std::string mode : {"packed", "bucketed"}) {
    Mix mix(mode, 2);
    mix.cfg.stages = {{0, 100, {{"web", 1}}}, {0, 0, {{"code", 1}, {"tiny", 1}}}};
    const int64_t B = 2, G = 4, steps = 10;
    auto loader = [&](int r, int world) {
      return std::make_unique<Loader>(mix.cfg, mix.manifests, "train", kT, B, r, world, 9, G / world, /*step_blocks=*/true);
    };
    // Every step's G global micro-batches, and the step's source tokens as rank 0's calls add them.
    auto run = [&](int world, int64_t cut, int then) {
      std::vector<std::vector<Batch>> out(steps, std::vector<Batch>(G));
      std::vector<std::vector<int64_t>> tokens(steps, std::vector<int64_t>(3, 0));
      std::vector<std::unique_ptr<Loader>> ranks;
      for (int r = 0; r < world; ++r) ranks.push_back(loader(r, world));
      for (int64_t s = 0; s < steps; ++s) {
        if (s == cut) {
          const LoaderState st = ranks[0]->state();
          world = then, ranks.clear();
          for (int r = 0; r < world; ++r) ranks.push_back(loader(r, world)), ranks.back()->load_state(st);
        }
        const int64_t A = G / world;
        for (int r = 0; r < world; ++r)
          for (int64_t k = 0; k < A; ++k) {
            Batch b = ranks[static_cast<size_t>(r)]->next();
            if (r == 0)
              for (size_t i = 0; i < 3; ++i) tokens[s][i] += b.source_tokens.at(i);
            out[s][r * A + k] = std::move(b);
          }
      }
      return std::make_pair(out, tokens);
    };
    const auto one = run(1, steps, 0);
    for (int64_t s = 0; s < steps; ++s) {
      const auto& t = one.second[s];
      if (s < 2) {
        EXPECT_TRUE(t[0] > 0 && t[1] == 0 && t[2] == 0) << mode << " step " << s + 1 << ": stage 1, web alone";
      } else {
        EXPECT_TRUE(t[0] == 0 && t[1] > 0 && t[2] > 0) << mode << " step " << s + 1 << ": stage 2";
      }
    }
    for (const auto& [world, cut, then] : std::vector<std::tuple<int, int64_t, int>>{{2, steps, 0}, {4, steps, 0}, {2, 5, 4}}) {
      const auto got = run(world, cut, then);
      for (int64_t s = 0; s < steps; ++s) {
        const std::string what = mode + " world " + std::to_string(world) + " cut " + std::to_string(cut) + " step " +
                                  std::to_string(s + 1);
        for (int64_t j = 0; j < G; ++j) {
          const Batch& a = one.first[s][j];
          const Batch& b = got.first[s][j];
          EXPECT_EQ(a.hash, b.hash) << what << " micro-batch " << j;
          EXPECT_TRUE(a.inputs == b.inputs && a.targets == b.targets && a.origins == b.origins) << what << " micro-batch " << j;
        }
        EXPECT_EQ(got.second[s], one.second[s]) << what;
      }
    }
  }
}

TEST(MixTest, TinySourceWrapsIsLoggedAndCapped) {
  TempDir logdir;
  log::init(logdir / "earlier.txt", false);  // the first file a process opens gets the lines logged before (earlier tests')
  log::init(logdir / "log.txt", false);
  Mix mix("packed", 1);
  mix.cfg.sources[2].weight = 50;
  mix.cfg.sources[2].max_epochs = 2;
  DataConfig alone = mix.cfg;
  alone.sources = {mix.cfg.sources[2]};
  const int64_t n = Loader(alone, {mix.manifests[2]}, "train", kT, 1, 0, 1, 9, 1).samples_per_epoch();
  Ranks l(mix.cfg, mix.manifests, 4, 1);
  int64_t tiny = 0, others = 0;
  for (int k = 0; k < 60; ++k) {
    const Global g = l.next();  // held: a range-for over l.next()[0].origins dangles (found by TSan)
    for (const auto& o : g[0].origins) (o.source == 2 ? tiny : others) += 1;
  }
  EXPECT_EQ(tiny, 2 * n) << "exactly max_epochs epochs of the tiny source";
  EXPECT_EQ(tiny + others, 60 * 4);
  const std::string log = test::read_text(logdir / "log.txt");
  log::init("", false);
  EXPECT_NE(log.find("source 'tiny' starts epoch 1"), std::string::npos) << log;
  EXPECT_NE(log.find("source 'tiny' reached max_epochs=2"), std::string::npos) << log;
  EXPECT_EQ(log.find("source 'tiny' starts epoch 2"), std::string::npos) << log;
}

TEST(MixTest, RefusedInputsAndChanges) {
  Mix mix("packed", 1);
  // Mismatched tokenizers: both sources named.
  make_source(mix.tmp.path(), "other", {3}, 4, "sentencepiece-x");
  DataConfig c = mix.cfg;
  c.sources.push_back(source("other", mix.tmp / "other", 1));
  std::string e = data_error([&] { open_train_data(c); });
  EXPECT_NE(e.find("source 'web'"), std::string::npos) << e;
  EXPECT_NE(e.find("source 'other'"), std::string::npos) << e;
  EXPECT_EQ(e.find('\n'), std::string::npos);
  // A missing source names its directory.
  c = mix.cfg;
  c.sources[1].path = mix.tmp / "nowhere";
  e = data_error([&] { open_train_data(c); });
  EXPECT_NE(e.find(mix.tmp / "nowhere"), std::string::npos) << e;
  // Unknown source in a stage; non-positive weights; both data.train and data.sources.
  auto config_error = [](const DataConfig& d) {
    try {
      validate(d, kT);
    } catch (const ConfigError& x) {
      return std::string(x.what());
    }
    return std::string("no error");
  };
  c = mix.cfg;
  c.stages = {{0, 0, {{"webb", 1}}}};
  EXPECT_EQ(config_error(c), "key 'data.stages': stage 1 names unknown source 'webb'");
  c = mix.cfg;
  c.sources[1].weight = 0;
  EXPECT_EQ(config_error(c), "key 'data.sources': source 'code': weight must be > 0, got 0.000000");
  c.sources[1].weight = -1;
  EXPECT_NE(config_error(c).find("weight must be > 0"), std::string::npos);
  // At resume: a read source removed, or changed, is refused naming it; force continues.
  Ranks l(mix.cfg, mix.manifests, 2, 1);
  for (int k = 0; k < 5; ++k) l.next();
  const std::string state = l.state();
  c = mix.cfg;
  c.sources.erase(c.sources.begin() + 1);
  std::vector<Manifest> two = {mix.manifests[0], mix.manifests[2]};
  e = data_error([&] { Ranks r(c, two, 2, 1, state); });
  EXPECT_NE(e.find("source 'code' was read"), std::string::npos) << e;
  Ranks forced(c, two, 2, 1, state, /*force=*/true);
  forced.next();
  Manifest changed = make_source(mix.tmp.path(), "code2", {25}, 77);
  c = mix.cfg;
  c.sources[1].path = changed.dir;
  e = data_error([&] { Ranks r(c, {mix.manifests[0], changed, mix.manifests[2]}, 2, 1, state); });
  EXPECT_NE(e.find("source 'code' changed: data version"), std::string::npos) << e;
  // Appending a source is allowed: it starts at its beginning, and the changed mixture starts a
  // segment at the resumed batch. Its exact count, by docs/data.md's rule replayed here: each packed
  // sample (kT target tokens) comes from the source furthest behind its share, w * (segment tokens
  // + kT) - its tokens, the first on a tie.
  c = mix.cfg;
  Manifest extra = make_source(mix.tmp.path(), "extra", {6}, 5);
  c.sources.push_back(source("extra", extra.dir, 2));
  Ranks appended(c, {mix.manifests[0], mix.manifests[1], mix.manifests[2], extra}, 2, 1, state);
  const std::vector<double> w = {5 / 12.0, 3 / 12.0, 2 / 12.0, 2 / 12.0};
  std::vector<int64_t> want(4, 0);
  int64_t seg = 0;
  std::vector<int64_t> got(4, 0);
  std::set<int64_t> extra_ids;
  int64_t extra_rows = 0, extra_positions = 0;
  for (int k = 0; k < 10; ++k) {
    const Global g = appended.next();
    for (size_t s = 0; s < 4; ++s) got[s] += g[0].source_tokens[s];
    for (int64_t row = 0; row < 2; ++row) {
      size_t best = 0;
      for (size_t s = 1; s < 4; ++s)
        if (w[s] * static_cast<double>(seg + kT) - static_cast<double>(want[s]) >
            w[best] * static_cast<double>(seg + kT) - static_cast<double>(want[best]))
          best = s;
      want[best] += kT, seg += kT;
    }
    for (int64_t row = 0; row < g[0].rows; ++row) {  // the rows that hold the appended source's tokens
      bool mine = false;
      for (int64_t t = 0; t < g[0].cols; ++t) {
        const int64_t id = g[0].inputs[row * g[0].cols + t];
        if (id >= first_id(5) && id < first_id(5) + static_cast<int64_t>(extra.shards[0].tokens))
          mine = true, ++extra_positions, extra_ids.insert(id);
      }
      extra_rows += mine;
    }
  }
  EXPECT_EQ(got, want) << "tokens per source in the 10 batches after the resume";
  EXPECT_EQ(got[3], 3 * kT) << "the appended source's exact share of 160 tokens at weight 2/12";
  EXPECT_EQ(extra_rows * kT, got[3]) << "its rows in the batches hold the tokens counted";
  EXPECT_EQ(static_cast<int64_t>(extra_ids.size()), extra_positions) << "each of its tokens read once";
}

}  // namespace
}  // namespace lm::data
