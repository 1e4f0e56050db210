// The streaming loader refusing bad data and bad options: corrupt, truncated and mismatched shards
// (DataError naming the file), bad options (ConfigError naming the key), a state from another order.

#include <fstream>

#include "tests/data/loader_util.h"

namespace lm::data {
namespace {

using namespace loader_test;  // NOLINT: the shared helpers
using test::data_error;
using test::TempDir;

// ---- errors ------------------------------------------------------------------------------------

void patch(const std::string& path, long offset, const std::string& bytes) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(offset);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

TEST(LoaderErrorTest, BadShardsAreDataErrorsNamingTheFile) {
  TempDir tmp;
  const auto shards = random_shards({5, 5, 5}, 5, 10, 29);
  auto fresh = [&] { return make_dataset(tmp.path(), shards); };
  auto construct = [&](const Manifest& m, const std::string& verify) {
    DataConfig c = config("packed");
    c.verify = verify;
    Loader l(test::train_form(c, m.dir), {m}, "train", 4, 2, 0, 1, 1);
  };
  Manifest m = fresh();
  const std::string p1 = tmp / m.shards[1].file;

  patch(p1, 0, "XX");
  for (auto v : {"lazy", "full"}) {
    std::string e = data_error([&] { construct(m, v); });
    EXPECT_NE(e.find(p1 + ": not a token shard (bad magic)"), std::string::npos) << e;
  }
  m = fresh();
  std::filesystem::resize_file(p1, std::filesystem::file_size(p1) - 2);
  EXPECT_NE(data_error([&] { construct(m, "lazy"); }).find(p1 + ": file size"), std::string::npos);

  m = fresh();
  patch(p1, static_cast<long>(std::filesystem::file_size(p1)) - 2, "\x7f");  // a token changed
  std::string e = data_error([&] { construct(m, "full"); });
  EXPECT_NE(e.find(p1 + ": checksum"), std::string::npos) << e;

  // verify=lazy: the construction succeeds; the first batch that opens the shard fails, and the
  // failure is sticky, in order, and never hangs.
  DataConfig c = config("packed", 3, 4);
  c.shuffle = false;
  Loader l(test::train_form(c, m.dir), {m}, "train", 4, 1, 0, 1, 1);
  int good = 0;
  for (;;) {
    try {
      l.next();
      ++good;
    } catch (const DataError& err) {
      EXPECT_NE(std::string(err.what()).find(p1 + ": checksum"), std::string::npos) << err.what();
      break;
    }
  }
  EXPECT_GT(good, 0) << "shard 0's batches come first";
  EXPECT_THROW(l.next(), DataError);

  m = fresh();
  std::filesystem::remove(tmp / m.shards[2].file);
  e = data_error([&] { construct(m, "lazy"); });
  EXPECT_NE(e.find(tmp / m.shards[2].file), std::string::npos) << e;

  m = fresh();
  e = data_error([&] { Loader(test::train_form(config("packed"), m.dir), {m}, "test", 4, 1, 0, 1, 1); });
  EXPECT_NE(e.find("split 'test' has no shards"), std::string::npos) << e;
  e = data_error([&] { Loader(test::train_form(config("packed"), m.dir), {m}, "train", 1000, 1, 0, 1, 1); });
  EXPECT_NE(e.find(tmp.path() + ": split 'train' is too short"), std::string::npos) << e;
}

// The data.* rules are data_config.h's validate(), the one the config loader calls too.
TEST(LoaderErrorTest, BadOptionsAreConfigErrorsNamingTheKey) {
  TempDir tmp;
  Manifest m = make_dataset(tmp.path(), random_shards({5}, 5, 10, 41));
  auto config_error = [&](const std::function<void(DataConfig&)>& edit) -> std::string {
    DataConfig c = config("bucketed");
    edit(c);
    try {
      Loader l(test::train_form(c, m.dir), {m}, "train", 4, 1, 0, 1, 1);
    } catch (const ConfigError& e) {
      std::string what = e.what();
      EXPECT_THROW(validate(c, 4), ConfigError) << what;
      return what;
    }
    ADD_FAILURE() << "no ConfigError";
    return "";
  };
  EXPECT_EQ(config_error([](DataConfig& c) { c.mode = "random"; }),
            "key 'data.mode': must be one of packed|bucketed, got 'random'");
  EXPECT_EQ(config_error([](DataConfig& c) { c.workers = 0; }), "key 'data.workers': must be in [1, 256], got 0");
  EXPECT_EQ(config_error([](DataConfig& c) { c.prefetch = 1025; }), "key 'data.prefetch': must be in [1, 1024], got 1025");
  EXPECT_EQ(config_error([](DataConfig& c) { c.token_budget = -1; }), "key 'data.token_budget': must be >= 0, got -1");
  EXPECT_EQ(config_error([](DataConfig& c) { c.token_budget = 3; }),
            "key 'data.token_budget': must be >= seq_len (4) so that one sample fits, got 3");
  EXPECT_NE(config_error([](DataConfig& c) { c.long_docs = "drop"; }).find("key 'data.long_docs'"), std::string::npos);
  EXPECT_NE(config_error([](DataConfig& c) { c.verify = "none"; }).find("key 'data.verify'"), std::string::npos);
  DataConfig packed = config("packed");
  packed.token_budget = 3;  // only bucketed mode uses the budget
  EXPECT_NO_THROW(validate(packed, 4));
}

// The shard-versus-manifest check is Manifest::open_shard's, for the loader and the ValReader alike.
TEST(LoaderErrorTest, ShardThatDoesNotMatchItsEntryIsDataError) {
  TempDir tmp;
  Manifest m = make_dataset(tmp.path(), random_shards({5, 5}, 5, 10, 43));
  const std::string p1 = tmp / m.shards[1].file;
  ShardWriter w(p1, TokenDtype::kU16);
  const std::vector<uint32_t> doc = {1, 2, 3};
  w.add_document(doc.data(), doc.size());
  w.finish();
  std::string e = data_error([&] { Loader(test::train_form(config("packed"), m.dir), {m}, "train", 4, 1, 0, 1, 1); });
  EXPECT_EQ(e, p1 + ": does not match its entry in manifest.json (docs, tokens or dtype)");
  EXPECT_EQ(data_error([&] { m.open_shard(m.shards[1]); }), e);
}

TEST(LoaderErrorTest, StateFromAnotherOrderIsRefusedNamingTheField) {
  TempDir tmp;
  Manifest m = make_dataset(tmp.path(), random_shards({5, 5}, 5, 10, 31));
  Loader a(test::train_form(config("packed"), m.dir), {m}, "train", 4, 2, 0, 1, 1);
  a.next();
  const LoaderState s = LoaderState::from_json(a.state().to_json());
  EXPECT_EQ(s.cursor, 2u);
  EXPECT_EQ(s.batches, 1u);
  auto refused = [&](DataConfig c, int64_t T, uint64_t seed, const std::string& field) {
    Loader b(test::train_form(c, m.dir), {m}, "train", T, 2, 0, 1, seed);
    std::string e = data_error([&] { b.load_state(s); });
    EXPECT_NE(e.find("field '" + field + "'"), std::string::npos) << e;
  };
  refused(config("packed"), 4, 2, "seed");
  refused(config("packed"), 5, 1, "seq_len");
  refused(config("bucketed"), 4, 1, "mode");
  DataConfig noshuf = config("packed");
  noshuf.shuffle = false;
  refused(noshuf, 4, 1, "shuffle");
  TempDir other;
  Manifest m2 = make_dataset(other.path(), random_shards({5, 5}, 5, 10, 32));
  Loader c(test::train_form(config("packed"), m2.dir), {m2}, "train", 4, 2, 0, 1, 1);
  EXPECT_NE(data_error([&] { c.load_state(s); }).find("field 'data_version'"), std::string::npos);
  EXPECT_NE(data_error([] { LoaderState::from_json("{\"version\": 1}"); }).find("loader state: malformed"), std::string::npos);
  // A different micro batch is fine in packed mode: the cursor counts samples.
  Loader d(test::train_form(config("packed"), m.dir), {m}, "train", 4, 3, 0, 1, 1);
  d.load_state(s);
  EXPECT_EQ(d.next().origins.front(), a.next().origins.front());
}

}  // namespace
}  // namespace lm::data
