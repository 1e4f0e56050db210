// The streaming loader on tiny synthetic shards: exact packed windows and per-epoch coverage across
// ranks, determinism over worker counts and prefetch depths, exact resume at every batch boundary,
// world-size changes, rank balance on uneven shards, bucketing (padding, budget, split/truncate),
// corrupt and missing data, and prompt shutdown.

#include "tests/data/loader_util.h"

namespace lm::data {
namespace {

using namespace loader_test;  // NOLINT: the shared helpers
using test::data_error;
using test::TempDir;

std::vector<Batch> take(Loader& l, size_t n) {
  std::vector<Batch> out;
  for (size_t i = 0; i < n; ++i) out.push_back(l.next());
  return out;
}

void expect_same(const Batch& a, const Batch& b, const std::string& what) {
  EXPECT_EQ(a.index, b.index) << what;
  EXPECT_EQ(a.epoch, b.epoch) << what;
  EXPECT_EQ(a.rows, b.rows) << what;
  EXPECT_EQ(a.cols, b.cols) << what;
  EXPECT_EQ(a.hash, b.hash) << what;
  EXPECT_TRUE(a.inputs == b.inputs) << what;
  EXPECT_TRUE(a.targets == b.targets) << what;
  EXPECT_TRUE(a.origins == b.origins) << what;
}

// The tokens of one row: inputs then the last target (unpadded).
std::vector<int64_t> row_tokens(const Batch& b, int64_t r) {
  std::vector<int64_t> out;
  for (int64_t t = 0; t < b.cols && b.targets[r * b.cols + t] != -1; ++t) out.push_back(b.inputs[r * b.cols + t]);
  int64_t last = 0;
  for (int64_t t = 0; t < b.cols && b.targets[r * b.cols + t] != -1; ++t) last = b.targets[r * b.cols + t];
  out.push_back(last);
  return out;
}

// One epoch's stream: documents in shard order, each followed by EOS.
std::vector<int64_t> stream_of(const std::vector<Docs>& shards, uint32_t eos) {
  std::vector<int64_t> s;
  for (const auto& docs : shards)
    for (const auto& d : docs) s.insert(s.end(), d.begin(), d.end()), s.push_back(eos);
  return s;
}

// ---- packed ------------------------------------------------------------------------------------

TEST(LoaderPackedTest, WindowsAreExactAcrossShardsRanksAndEpochs) {
  TempDir tmp;
  auto shards = random_shards({5, 1, 7}, 0, 9, 3);
  shards[1] = {{}, {7, 8}};
  Manifest m = make_dataset(tmp.path(), shards);
  const auto one = stream_of(shards, 256);
  for (int64_t T : {1, 3, 7}) {
    for (int W : {1, 2, 3}) {
      DataConfig c = config("packed");
      c.shuffle = false;
      std::vector<std::unique_ptr<Loader>> ranks;
      for (int r = 0; r < W; ++r) ranks.push_back(std::make_unique<Loader>(test::train_form(c, m.dir), std::vector<Manifest>{m}, "train", T, 2, r, W, 1));
      const uint64_t N = (one.size() - 1) / T;
      ASSERT_EQ(ranks[0]->samples_per_epoch(), static_cast<int64_t>(N));
      for (uint64_t k = 0; k < 3 * N / (2 * W) + 2; ++k) {  // about three epochs, boundaries inside batches
        for (int r = 0; r < W; ++r) {
          Batch b = ranks[r]->next();
          ASSERT_EQ(b.rows, 2);
          ASSERT_EQ(b.cols, T);
          EXPECT_EQ(b.epoch, static_cast<int64_t>(k * 2 * W / N));
          EXPECT_EQ(b.target_tokens, 2 * T);
          EXPECT_EQ(b.pad_tokens, 0);
          for (int64_t row = 0; row < 2; ++row) {
            const uint64_t i = (k * W + r) * 2 + row, j = i % N;  // global sample, sample in its epoch
            const std::vector<int64_t> want(one.begin() + j * T, one.begin() + j * T + T + 1);
            ASSERT_EQ(row_tokens(b, row), want) << "T=" << T << " W=" << W << " batch " << k << " rank " << r;
          }
        }
      }
    }
  }
}

// With shuffling and unique token ids: over one epoch, across all ranks, every window is a real
// window of the stream and every token is a target exactly once (except the epoch's unused tail).
TEST(LoaderPackedTest, EveryTokenIsATargetOncePerEpochAcrossRanks) {
  TempDir tmp;
  auto shards = random_shards({6, 3, 9, 4}, 1, 12, 5, /*unique=*/true);
  Manifest m = make_dataset(tmp.path(), shards, 1 << 20);
  const uint32_t eos = (1 << 20) - 2;
  // Where each token sits: (shard, position in that shard's stream); shard streams.
  std::vector<std::vector<int64_t>> streams;
  std::map<int64_t, std::pair<size_t, size_t>> where;
  for (size_t s = 0; s < shards.size(); ++s) {
    streams.push_back(stream_of({shards[s]}, eos));
    for (size_t p = 0; p < streams[s].size(); ++p)
      if (streams[s][p] != eos) where[streams[s][p]] = {s, p};
  }
  const int64_t T = 5;
  size_t L = 0;
  for (auto& s : streams) L += s.size();
  for (int W : {1, 2, 3}) {
    std::vector<std::unique_ptr<Loader>> ranks;
    for (int r = 0; r < W; ++r) ranks.push_back(std::make_unique<Loader>(test::train_form(config("packed", 2), m.dir), std::vector<Manifest>{m}, "train", T, 2, r, W, 9));
    const uint64_t N = ranks[0]->samples_per_epoch(), G = 2 * W;
    ASSERT_EQ(N, (L - 1) / T);
    std::multiset<int64_t> targets;
    size_t eos_targets = 0;
    for (uint64_t k = 0; k * G < N; ++k)
      for (int r = 0; r < W; ++r) {
        Batch b = ranks[r]->next();
        for (int64_t row = 0; row < 2; ++row) {
          if (k * G + r * 2 + row >= N) continue;  // next epoch
          auto w = row_tokens(b, row);
          // The window follows its origin's shard stream, then the start of another shard's stream.
          const SampleOrigin o = b.origins[row];
          size_t s = o.shard, p = 0;
          for (size_t d = 0; d < o.doc; ++d) p += shards[s][d].size() + 1;
          p += o.offset;
          for (int64_t t = 0; t <= T; ++t, ++p) {
            if (p == streams[s].size()) {
              ASSERT_TRUE(where.count(w[t])) << "a window continues at a shard start";
              std::tie(s, p) = where[w[t]];
              ASSERT_EQ(p, 0u);
            }
            ASSERT_EQ(w[t], streams[s][p]) << "W=" << W << " batch " << k;
          }
          for (int64_t t = 1; t <= T; ++t) {
            if (w[t] == eos) ++eos_targets;
            else targets.insert(w[t]);
          }
        }
      }
    EXPECT_EQ(targets.size() + eos_targets, N * T);
    EXPECT_EQ(std::set<int64_t>(targets.begin(), targets.end()).size(), targets.size()) << "a token was a target twice";
    EXPECT_LE(where.size() - targets.size(), L - 1 - N * T + 1) << "tokens never targeted beyond the tail";
  }
}

// ---- determinism and resume --------------------------------------------------------------------

struct Mode {
  DataConfig cfg;
  int64_t T, B;
};

std::vector<Mode> setups() {
  DataConfig packed = config("packed"), fixed = config("bucketed"), budget = config("bucketed");
  for (DataConfig* c : {&packed, &fixed, &budget}) c->shuffle_buffer = 7;
  fixed.pad_multiple = 4;
  budget.token_budget = 24;
  budget.long_docs = "split";
  return {{packed, 5, 2}, {fixed, 6, 2}, {budget, 6, 0}};
}

TEST(LoaderTest, SameSeedSameBatchesWhateverWorkersAndPrefetch) {
  TempDir tmp;
  Manifest m = make_dataset(tmp.path(), random_shards({8, 3, 12}, 0, 15, 11));
  for (const Mode& s : setups()) {
    auto run = [&](int64_t workers, int64_t prefetch, uint64_t seed) {
      DataConfig c = s.cfg;
      c.workers = workers, c.prefetch = prefetch;
      Loader l(test::train_form(c, m.dir), {m}, "train", s.T, std::max<int64_t>(s.B, 1), 0, 1, seed);
      return take(l, 40);
    };
    const auto ref = run(1, 1, 7);
    for (auto [w, p] : {std::pair<int64_t, int64_t>{3, 1}, {1, 8}, {3, 8}}) {
      const auto got = run(w, p, 7);
      for (size_t k = 0; k < ref.size(); ++k)
        expect_same(got[k], ref[k], s.cfg.mode + " workers " + std::to_string(w) + " prefetch " + std::to_string(p));
    }
    const auto other = run(2, 4, 8);
    size_t differ = 0;
    for (size_t k = 0; k < ref.size(); ++k) differ += other[k].hash != ref[k].hash;
    EXPECT_GT(differ, ref.size() / 2) << s.cfg.mode << ": another seed gives another order";
  }
}

TEST(LoaderTest, ExactResumeAtEveryBatchBoundary) {
  TempDir tmp;
  Manifest m = make_dataset(tmp.path(), random_shards({5, 2, 9}, 0, 14, 12));
  for (const Mode& s : setups()) {
    for (int64_t workers : {1, 3}) {
      DataConfig c = s.cfg;
      c.workers = workers;
      const int64_t B = std::max<int64_t>(s.B, 1);
      Loader full(test::train_form(c, m.dir), {m}, "train", s.T, B, 0, 1, 3);
      const size_t K = 4 * full.samples_per_epoch() / B + 3;  // several epochs
      std::vector<Batch> ref;
      std::vector<std::string> states{full.state().to_json()};
      for (size_t k = 0; k < K; ++k) ref.push_back(full.next()), states.push_back(full.state().to_json());
      EXPECT_GE(ref.back().epoch, 2) << s.cfg.mode;
      for (size_t k = 0; k < K; ++k) {
        Loader resumed(test::train_form(c, m.dir), {m}, "train", s.T, B, 0, 1, 3);
        resumed.load_state(LoaderState::from_json(states[k]));
        for (size_t i = k; i < std::min(K, k + 8); ++i)
          expect_same(resumed.next(), ref[i], s.cfg.mode + " resumed after batch " + std::to_string(k));
        ASSERT_FALSE(::testing::Test::HasFailure());
      }
    }
  }
}

// Runs `ranks` loaders in lock step and returns every sample they produce (origin + epoch) until
// the shared cursor reaches `until`, starting from `from` (a state JSON, or "" for the start).
std::vector<std::pair<int64_t, SampleOrigin>> run_ranks(const DataConfig& c, const Manifest& m, int64_t T, int64_t B,
                                                       int W, const std::string& from, uint64_t until,
                                                       std::string* state_out) {
  std::vector<std::unique_ptr<Loader>> ranks;
  for (int r = 0; r < W; ++r) {
    ranks.push_back(std::make_unique<Loader>(test::train_form(c, m.dir), std::vector<Manifest>{m}, "train", T, B, r, W, 5));
    if (!from.empty()) ranks.back()->load_state(LoaderState::from_json(from));
  }
  std::vector<std::pair<int64_t, SampleOrigin>> out;
  while (ranks[0]->state().cursor < until)
    for (auto& l : ranks) {
      const uint64_t before = l->state().cursor;
      Batch b = l->next();
      const uint64_t n = static_cast<uint64_t>(l->samples_per_epoch());
      for (int64_t row = 0; row < b.rows; ++row)
        out.emplace_back(static_cast<int64_t>(before / n), b.origins[row]);  // before < n here
    }
  std::set<std::string> states;
  for (auto& l : ranks) states.insert(l->state().to_json());
  EXPECT_EQ(states.size(), 1u) << "ranks agree on the state";
  *state_out = *states.begin();
  return out;
}

TEST(LoaderTest, WorldSizeChangeNeitherRepeatsNorSkips) {
  TempDir tmp;
  // 60 non-empty documents: 60 bucketed samples per epoch; packed windows sized to 60 too.
  auto shards = random_shards({20, 12, 28}, 1, 12, 13);
  Manifest m = make_dataset(tmp.path(), shards);
  auto sorted = [](std::vector<std::pair<int64_t, SampleOrigin>> v) {
    std::sort(v.begin(), v.end(), [](const auto& a, const auto& b) {
      return std::tie(a.second.shard, a.second.doc, a.second.offset) < std::tie(b.second.shard, b.second.doc, b.second.offset);
    });
    return v;
  };
  for (Mode s : setups()) {
    s.cfg.long_docs = "truncate";
    const int64_t B = std::max<int64_t>(s.B, 1);
    const int64_t T = s.cfg.mode == "packed" ? static_cast<int64_t>((stream_of(shards, 256).size() - 1) / 60) : s.T;
    for (int64_t buffer : {7, 64}) {  // 64: the epoch is one block, resumed twice inside it
      s.cfg.shuffle_buffer = buffer;
      std::string st0, st1;
      const auto whole = sorted(run_ranks(s.cfg, m, T, B, 1, "", 60, &st0));
      ASSERT_EQ(whole.size(), 60u);
      for (int W2 : {1, 3, 4}) {
        // W=2 for 12 samples (3 fixed-size batches), then W2 ranks to the end of the epoch, saved
        // and resumed once more on the way (W2=4: the new batch grid is not aligned with the old).
        auto seen = run_ranks(s.cfg, m, T, B, 2, "", s.cfg.token_budget ? 10 : 12, &st1);
        auto rest = run_ranks(s.cfg, m, T, B, W2, st1, 30, &st0);
        seen.insert(seen.end(), rest.begin(), rest.end());
        rest = run_ranks(s.cfg, m, T, B, W2, st0, 60, &st1);
        seen.insert(seen.end(), rest.begin(), rest.end());
        const std::string what = s.cfg.mode + " buffer " + std::to_string(buffer) + " W2=" + std::to_string(W2);
        EXPECT_EQ(LoaderState::from_json(st1).cursor, 60u) << what;
        seen = sorted(seen);
        ASSERT_EQ(seen.size(), whole.size()) << what;
        for (size_t i = 0; i < seen.size(); ++i) {
          EXPECT_EQ(seen[i].first, 0) << what;
          EXPECT_TRUE(seen[i].second == whole[i].second) << what << " sample " << i;
        }
      }
    }
  }
}

// ---- balance, bucketing ------------------------------------------------------------------------

TEST(LoaderTest, UnevenShardsStayBalancedAcrossRanks) {
  TempDir tmp;
  auto shards = random_shards({4, 40, 4, 3}, 1, 30, 17);  // one shard 10x the others
  Manifest m = make_dataset(tmp.path(), shards);
  for (const Mode& s : setups()) {
    const int W = 3;
    const int64_t T = 16, B = 3;
    std::vector<std::unique_ptr<Loader>> ranks;
    DataConfig c = s.cfg;
    c.shuffle_buffer = 16;
    if (c.token_budget) c.token_budget = 64;
    for (int r = 0; r < W; ++r) ranks.push_back(std::make_unique<Loader>(test::train_form(c, m.dir), std::vector<Manifest>{m}, "train", T, B, r, W, 2));
    for (int k = 0; k < 60; ++k) {
      std::vector<Batch> b;
      for (auto& l : ranks) b.push_back(l->next());
      for (int r = 1; r < W; ++r) {
        if (c.mode == "packed") {
          EXPECT_EQ(b[r].target_tokens, b[0].target_tokens);
        } else {
          EXPECT_LE(std::abs(b[r].target_tokens - b[r - 1].target_tokens), T) << "batch " << k;
        }
        if (c.token_budget == 0) {
          EXPECT_EQ(b[r].rows, B);
        }
        EXPECT_GE(b[r].rows, 1);
      }
    }
  }
}

TEST(LoaderBucketedTest, RowsArePaddedAtTheirEndsWithinBudgetAndMultiple) {
  TempDir tmp;
  auto shards = random_shards({30, 50}, 0, 40, 19);
  Manifest m = make_dataset(tmp.path(), shards);
  const int64_t T = 20;
  for (int64_t budget : {0, 50, 130}) {
    for (const std::string long_docs : {"truncate", "split"}) {
      DataConfig c = config("bucketed");
      c.pad_multiple = 8;
      c.token_budget = budget;
      c.long_docs = long_docs;
      c.shuffle_buffer = 13;
      Loader l(test::train_form(c, m.dir), {m}, "train", T, 4, 0, 1, 4);
      int64_t samples = 0;
      for (auto& docs : shards)
        for (auto& d : docs) samples += d.empty() ? 0 : long_docs == "split" ? (d.size() + T - 1) / T : 1;
      ASSERT_EQ(l.samples_per_epoch(), samples) << long_docs;
      std::multiset<std::tuple<uint32_t, uint64_t, uint64_t>> seen;
      while (static_cast<int64_t>(l.state().cursor) < samples) {
        Batch b = l.next();
        ASSERT_GE(b.rows, 1);
        EXPECT_TRUE(b.cols % 8 == 0 || b.cols == T) << b.cols;
        EXPECT_LE(b.cols, T);
        if (budget) {
          EXPECT_LE(b.rows * b.cols, budget);
        } else {
          EXPECT_EQ(b.rows, 4);
        }
        int64_t real = 0, longest = 0;
        for (int64_t r = 0; r < b.rows; ++r) {
          const SampleOrigin o = b.origins[r];
          seen.insert({o.shard, o.doc, o.offset});
          std::vector<int64_t> s(shards[o.shard][o.doc].begin(), shards[o.shard][o.doc].end());
          s.push_back(256);
          s = std::vector<int64_t>(s.begin() + o.offset, s.begin() + std::min<size_t>(s.size(), o.offset + T + 1));
          if (long_docs == "truncate") {
            EXPECT_EQ(o.offset, 0u);
          }
          const int64_t n = static_cast<int64_t>(s.size()) - 1;
          longest = std::max(longest, n);
          real += n;
          for (int64_t t = 0; t < b.cols; ++t) {
            EXPECT_EQ(b.inputs[r * b.cols + t], t < n ? s[t] : 257) << "row " << r << " col " << t;
            EXPECT_EQ(b.targets[r * b.cols + t], t < n ? s[t + 1] : -1) << "row " << r << " col " << t;
          }
        }
        EXPECT_EQ(b.cols, std::min<int64_t>((longest + 7) / 8 * 8, T));
        EXPECT_EQ(b.target_tokens, real);
        EXPECT_EQ(b.pad_tokens, b.rows * b.cols - real);
      }
      // Every sample once; fixed-size batches may run a few samples into the next epoch.
      EXPECT_EQ(seen.size(), l.state().cursor);
      if (budget) {
        EXPECT_EQ(static_cast<int64_t>(l.state().cursor), samples) << "budget batches never cross a block";
      }
      EXPECT_EQ(static_cast<int64_t>(std::set<std::tuple<uint32_t, uint64_t, uint64_t>>(seen.begin(), seen.end()).size()), samples);
    }
  }
}

TEST(LoaderBucketedTest, PadsLessThanRandomBatching) {
  TempDir tmp;
  auto shards = random_shards({200, 200}, 1, 200, 23);
  Manifest m = make_dataset(tmp.path(), shards);
  const int64_t T = 256, B = 8;
  DataConfig c = config("bucketed");
  c.pad_multiple = 1;
  c.shuffle_buffer = 100;  // not a multiple of B: blocks begin and end inside batches
  int64_t pad = 0, real = 0;
  auto run = [&](Loader& l, int batches) {
    for (int k = 0; k < batches; ++k) {
      Batch b = l.next();
      pad += b.pad_tokens, real += b.target_tokens;
    }
  };
  Loader l(test::train_form(c, m.dir), {m}, "train", T, B, 0, 1, 6);
  run(l, 5);
  // A micro batch change (8 -> 6) moves the batch grid; batches stay bucketed on the new one.
  Loader l2(test::train_form(c, m.dir), {m}, "train", T, 6, 0, 1, 6);
  l2.load_state(l.state());
  run(l2, 60);
  // Random batches of the same documents.
  std::vector<int64_t> lens;
  for (auto& docs : shards)
    for (auto& d : docs) lens.push_back(static_cast<int64_t>(d.size()));
  std::shuffle(lens.begin(), lens.end(), std::mt19937(1));
  int64_t rpad = 0, rreal = 0;
  for (size_t i = 0; i + B <= lens.size(); i += B) {
    const int64_t mx = *std::max_element(lens.begin() + i, lens.begin() + i + B);
    for (size_t j = i; j < i + B; ++j) rpad += mx - lens[j], rreal += lens[j];
  }
  const double ours = double(pad) / (pad + real), random = double(rpad) / (rpad + rreal);
  EXPECT_LT(ours, random / 6) << "bucketed pad fraction " << ours << " vs random " << random;
}

// Step blocks (dist.invariant) in bucketed mode, G = 4 micro-batches of 3 rows per step at world
// sizes 1, 2 and 4 (grad_accum 4, 2, 1), blocks of 13 samples (micro-batches straddle them), split
// long documents, pad multiple 8: rank r's k-th micro-batch of a step is global micro-batch r*A + k,
// and global micro-batch j of every step has the same rows, padding, tokens and hash at every world
// size (those of a plain 1-rank run); the W calls' source_tokens add up to the step's at any W; a
// chain cut at 2 ranks and resumed at 4 continues the same micro-batches. Checked to fail with the
// planner cutting step-block micro-batches on the world size's grid (own_.ranks = world) and with
// rank r taking global micro-batch k*W + r (round-robin instead of contiguous blocks).
TEST(LoaderBucketedTest, StepBlocksDealTheSameMicroBatchesAtAnyWorldSize) {
  TempDir tmp;
  auto shards = random_shards({30, 25}, 0, 40, 31);
  Manifest m = make_dataset(tmp.path(), shards);
  const int64_t T = 16, B = 3, G = 4, steps = 12;  // 144 samples: about two epochs
  DataConfig c = config("bucketed");
  c.pad_multiple = 8;
  c.long_docs = "split";
  c.shuffle_buffer = 13;
  auto loader = [&](int r, int W, bool blocks) {
    return std::make_unique<Loader>(test::train_form(c, m.dir), std::vector<Manifest>{m}, "train", T, B, r, W, 5,
                                    G / W, blocks);
  };
  // Every step's G global micro-batches at world size W (resumed at `then` ranks after `cut` steps).
  auto run = [&](int W, int64_t cut, int then) {  // cut == steps: no cut
    std::vector<std::vector<Batch>> out(steps, std::vector<Batch>(G));
    std::vector<int64_t> step_tokens(steps, 0);
    std::vector<std::unique_ptr<Loader>> ranks;
    for (int r = 0; r < W; ++r) ranks.push_back(loader(r, W, true));
    for (int64_t s = 0; s < steps; ++s) {
      if (s == cut) {
        const LoaderState st = ranks[0]->state();
        W = then, ranks.clear();
        for (int r = 0; r < W; ++r) ranks.push_back(loader(r, W, true)), ranks.back()->load_state(st);
      }
      const int64_t A = G / W;
      for (int r = 0; r < W; ++r)
        for (int64_t k = 0; k < A; ++k) {
          Batch b = ranks[r]->next();
          if (r == 0) step_tokens[s] += b.source_tokens.at(0);
          out[s][r * A + k] = std::move(b);
        }
    }
    return std::make_pair(out, step_tokens);
  };
  const auto one = run(1, steps, 0);
  auto plain = loader(0, 1, false);
  int64_t padded_below_T = 0;
  for (int64_t s = 0; s < steps; ++s) {
    int64_t tokens = 0;
    for (int64_t j = 0; j < G; ++j) {
      const Batch& b = one.first[s][j];
      ASSERT_EQ(b.rows, B);
      tokens += b.target_tokens;
      expect_same(b, plain->next(), "world 1: step blocks vs plain, step " + std::to_string(s));
      padded_below_T += b.cols < T;
    }
    EXPECT_EQ(one.second[s], tokens) << "step " << s;
  }
  EXPECT_GT(padded_below_T, 0);  // some micro-batches padded below T: the bucketing shows
  for (const auto& [W, cut, then] : std::vector<std::tuple<int, int64_t, int>>{{2, steps, 0}, {4, steps, 0}, {2, 5, 4}}) {
    const auto got = run(W, cut, then);
    for (int64_t s = 0; s < steps; ++s) {
      for (int64_t j = 0; j < G; ++j) {
        Batch a = one.first[s][j];
        Batch b = got.first[s][j];
        a.index = b.index = 0;
        a.epoch = b.epoch = 0;  // a rank's count; the epoch at the call's cursor
        expect_same(a, b, "world " + std::to_string(W) + " cut " + std::to_string(cut) + ": step " +
                              std::to_string(s) + " micro-batch " + std::to_string(j));
      }
      EXPECT_EQ(got.second[s], one.second[s]) << "world " << W << " step " << s;
    }
  }
}

TEST(LoaderTest, DestructionWhileWorkersWaitIsPrompt) {
  TempDir tmp;
  Manifest m = make_dataset(tmp.path(), random_shards({50}, 50, 100, 37));
  const auto t0 = std::chrono::steady_clock::now();
  {
    Loader l(test::train_form(config("packed", 4, 1), m.dir), {m}, "train", 8, 2, 0, 1, 1);
    l.next();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the queue is full: workers wait
  }
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 1.0);
}

}  // namespace
}  // namespace lm::data