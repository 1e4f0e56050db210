// Remote datasets against real servers started here on loopback: nginx (Debian's, as a non-daemon
// with a temporary prefix) for HTTP, s3rver (npm, installed into .deps/ by launch/dev/npm_deps.sh) for
// S3, and tests/fault_proxy.py in front of them (drops, stalls, truncates, 503s, an outage). A test
// whose server cannot be found is SKIPPED, saying what is missing; it never passes silently.
//
// The outage of the fault test lasts LM_REMOTE_OUTAGE_S seconds (default 3 here, to keep the suite
// fast; the 30 s: LM_REMOTE_OUTAGE_S=30 ctest -R RemoteTest.TrainThroughFaults).
#include <cstdlib>
#include <filesystem>
#include <set>

#include "common/checksum.h"
#include "common/files.h"
#include "data/format/shard.h"
#include "data/loader/loader.h"
#include "data/loader/val_reader.h"
#include "data/remote/cache_dir.h"
#include "data/remote/store.h"
#include "tests/remote_servers.h"
#include "tests/testutil.h"

namespace lm {
namespace {

namespace fs = std::filesystem;
using test::count_in;
using test::find_nginx;
using test::find_s3rver;
using test::make_dataset;
using test::Server;
using test::start_nginx;
using test::TempDir;

DataConfig loader_config(const std::string& cache, int64_t limit_mb) {
  DataConfig c;
  c.shuffle_buffer = 256;
  c.cache_dir = cache;
  c.cache_limit_mb = limit_mb;
  c.remote_timeout_s = 30;
  return c;
}

// The first n batch hashes of a loader over `m` (seq_len 64, micro-batch 8, seed 7).
std::vector<uint64_t> hashes(const DataConfig& c, const data::Manifest& m, int n) {
  data::Loader loader(test::train_form(c, m.dir), {m}, "train", 64, 8, 0, 1, 7);
  std::vector<uint64_t> out;
  for (int i = 0; i < n; ++i) out.push_back(loader.next().hash);
  return out;
}

class RemoteTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (find_nginx().empty()) GTEST_SKIP() << "SKIPPED: nginx not found (Debian nginx-light; launch/dev/deps.sh installs it)";
  }
  TempDir tmp_;
};

// Through nginx with a cache of ~6 of the 17 shards: the batches equal the local loader's over more
// than an epoch, shards are evicted and fetched again, the cache stays under its limit.
TEST_F(RemoteTest, LoaderOverHttpEqualsLocalWithEviction) {
  const std::string data = make_dataset(tmp_.path(), 40000, 150000);
  auto nginx = start_nginx(tmp_.path(), tmp_.path());
  ASSERT_TRUE(nginx->up()) << test::read_text(tmp_ / "nginx/stdout.log");
  const std::string url = "http://127.0.0.1:" + std::to_string(nginx->port) + "/data";
  const DataConfig c = loader_config(tmp_ / "cache", 2);
  const data::Manifest local = data::Manifest::load(data);
  const data::Manifest remote = data::open_dataset(url, "data.train", data::remote_options(c));
  EXPECT_EQ(remote.data_version, local.data_version);
  data::Loader probe(test::train_form(c, local.dir), {local}, "train", 64, 8, 0, 1, 7);
  const int n = static_cast<int>(probe.samples_per_epoch() / 8 * 5 / 4);  // 1.25 epochs
  EXPECT_EQ(hashes(c, remote, n), hashes(c, local, n));
  {  // the validation reader too: the same windows, through the same cache
    data::ValReader vr(remote, "val", 64), vl(local, "val", 64);
    std::vector<int64_t> a, b;
    for (int i = 0; i < 50; ++i) {
      vr.next(8, a), vl.next(8, b);
      ASSERT_EQ(a, b) << "val batch " << i;
    }
  }
  const std::string log = test::read_text(tmp_ / "nginx/access.log");
  const size_t shards = local.split("train").size();
  EXPECT_GT(count_in(log, "/data/train_"), static_cast<int>(shards)) << "no shard was fetched twice: no eviction";
  uint64_t cached = 0;
  for (const auto& e : fs::directory_iterator(tmp_ / "cache"))
    if (e.path().filename() != ".lock") cached += fs::file_size(e.path());
  EXPECT_LE(cached, uint64_t{2} << 20);
  EXPECT_GT(cached, 0u);
}

// Bucketed mode plans from the manifest (one sample per document): no shard is fetched to learn
// the sizes, so the first batch needs only the shards of the first shuffle block and the ones
// ahead; then the batches equal the local loader's.
TEST_F(RemoteTest, BucketedLoaderFetchesNoShardToLearnSizes) {
  const std::string data = make_dataset(tmp_.path(), 3000, 4000);
  auto nginx = start_nginx(tmp_.path(), tmp_.path());
  ASSERT_TRUE(nginx->up());
  DataConfig c = loader_config(tmp_ / "cache", 64);
  c.mode = "bucketed", c.shuffle_buffer = 32, c.remote_ahead = 1;
  const size_t shards = data::Manifest::load(data).split("train").size();
  ASSERT_GE(shards, 20u);
  const data::Manifest remote = data::open_dataset("http://127.0.0.1:" + std::to_string(nginx->port) + "/data",
                                                   "data.train", data::remote_options(c));
  std::set<std::string> fetched;  // the train shards requested by the time the first batch is there
  {
    data::Loader loader(test::train_form(c, remote.dir), {remote}, "train", 64, 8, 0, 1, 7);
    loader.next();
    const std::string log = test::read_text(tmp_ / "nginx/access.log");
    for (size_t p = log.find("GET /data/train_"); p != std::string::npos; p = log.find("GET /data/train_", p + 1))
      fetched.insert(log.substr(p + 4, log.find(' ', p + 4) - p - 4));
  }
  EXPECT_GE(fetched.size(), 1u);
  EXPECT_LE(fetched.size(), 6u) << "of " << shards << " shards";
  EXPECT_EQ(hashes(c, remote, 100), hashes(c, data::Manifest::load(data), 100));
}

// The plan counts one sample per document from the manifest: a served shard with an empty document
// (prep writes none) is refused naming it when first read, not planned past.
TEST_F(RemoteTest, BucketedShardWithAnEmptyDocumentIsNamed) {
  const std::string data = make_dataset(tmp_.path(), 3000, 20000);
  data::Manifest m = data::Manifest::load(data);
  for (auto& s : m.shards) {  // every shard gets an empty document at its end
    const std::string path = data + "/" + s.file;
    std::vector<std::vector<uint32_t>> docs;
    {
      data::ShardReader r(path);
      for (uint64_t i = 0; i < r.num_docs(); ++i) docs.push_back(r.read_doc(i));
    }
    data::ShardWriter w(path, data::TokenDtype::kU16);
    for (const auto& d : docs) w.add_document(d.data(), d.size());
    w.add_document(nullptr, 0);
    s.docs = w.num_docs();
    s.xxh64 = hex64(w.finish());
  }
  m.data_version = data::compute_data_version(m.shards, m.tokenizer.hash);
  files::write_file_atomic(data + "/manifest.json", m.to_json());
  auto nginx = start_nginx(tmp_.path(), tmp_.path());
  ASSERT_TRUE(nginx->up());
  DataConfig c = loader_config(tmp_ / "cache", 64);
  c.mode = "bucketed";
  const std::string url = "http://127.0.0.1:" + std::to_string(nginx->port) + "/data";
  const data::Manifest remote = data::open_dataset(url, "data.train", data::remote_options(c));
  const std::string e = test::data_error([&] { hashes(c, remote, 50); });
  EXPECT_NE(e.find(url + "/train_"), std::string::npos) << e;
  EXPECT_NE(e.find("not the"), std::string::npos) << e;
  EXPECT_NE(e.find("an empty document?"), std::string::npos) << e;
}

// Bucketed mode with the default shuffle block: the batches equal the local loader's.
TEST_F(RemoteTest, BucketedLoaderOverHttpEqualsLocal) {
  const std::string data = make_dataset(tmp_.path(), 3000, 20000);
  auto nginx = start_nginx(tmp_.path(), tmp_.path());
  ASSERT_TRUE(nginx->up());
  DataConfig c = loader_config(tmp_ / "cache", 64);
  c.mode = "bucketed";
  const data::Manifest remote = data::open_dataset("http://127.0.0.1:" + std::to_string(nginx->port) + "/data",
                                                   "data.train", data::remote_options(c));
  EXPECT_EQ(hashes(c, remote, 300), hashes(c, data::Manifest::load(data), 300));
}

// s3rver with SigV4 credentials from the environment: the same batches as the local loader.
TEST_F(RemoteTest, LoaderOverS3EqualsLocal) {
  const std::string s3rver = find_s3rver();
  if (s3rver.empty()) GTEST_SKIP() << "SKIPPED: s3rver not found in .deps/node (launch/dev/npm_deps.sh installs it)";
  const std::string data = make_dataset(tmp_.path(), 3000, 20000);
  Server s3;
  s3.port = test::free_port();
  files::make_dirs(tmp_ / "s3");
  s3.proc = test::spawn_bin(s3rver, {"-d", tmp_ / "s3", "-a", "127.0.0.1", "-p", std::to_string(s3.port), "--silent",
                                     "--configure-bucket", "corpus"}, tmp_ / "s3rver.log");
  ASSERT_TRUE(s3.up()) << test::read_text(tmp_ / "s3rver.log");
  const std::string endpoint = "http://127.0.0.1:" + std::to_string(s3.port);
  for (const auto& e : fs::directory_iterator(data)) {  // upload with curl's own SigV4
    auto r = test::run_bin("/usr/bin/curl", {"-sf", "-H", "x-amz-content-sha256: UNSIGNED-PAYLOAD", "--aws-sigv4",
                                             "aws:amz:us-east-1:s3", "--user", "S3RVER:S3RVER", "-T", e.path().string(),
                                             endpoint + "/corpus/sets/bytes/" + e.path().filename().string()});
    ASSERT_EQ(r.exit_code, 0) << r.out;
  }
  ::setenv("AWS_ENDPOINT_URL", endpoint.c_str(), 1);
  ::setenv("AWS_REGION", "us-east-1", 1);
  ::setenv("AWS_ACCESS_KEY_ID", "S3RVER", 1);
  ::setenv("AWS_SECRET_ACCESS_KEY", "S3RVER", 1);
  const DataConfig c = loader_config(tmp_ / "cache", 64);
  const data::Manifest remote = data::open_dataset("s3://corpus/sets/bytes", "data.train", data::remote_options(c));
  const data::Manifest local = data::Manifest::load(data);
  EXPECT_EQ(hashes(c, remote, 400), hashes(c, local, 400));
  EXPECT_NE(test::data_error([&] { data::open_dataset("s3://corpus/missing", "data.train", data::remote_options(c)); })
                .find(endpoint + "/corpus/missing/manifest.json: HTTP 404"),
            std::string::npos);
  for (const char* v : {"AWS_ENDPOINT_URL", "AWS_REGION", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"}) ::unsetenv(v);
}

// Through the fault proxy at 30% failing requests (drops, stalls, truncations, 503s): the same
// batches, and truncated downloads were resumed with Range requests (nginx answered 206).
TEST_F(RemoteTest, LoaderThroughFaultsResumesWithRange) {
  const std::string data = make_dataset(tmp_.path(), 6000, 20000);
  auto nginx = start_nginx(tmp_.path(), tmp_.path());
  ASSERT_TRUE(nginx->up());
  auto proxy = test::start_proxy(nginx->port, tmp_.path(), {"--fail", "0.3", "--stall-s", "0.5", "--seed", "5"});
  ASSERT_TRUE(proxy->up());
  const DataConfig c = loader_config(tmp_ / "cache", 64);
  const data::Manifest local = data::Manifest::load(data);
  const data::Manifest remote =
      data::open_dataset("http://127.0.0.1:" + std::to_string(proxy->port) + "/data", "data.train", data::remote_options(c));
  data::Loader probe(test::train_form(c, local.dir), {local}, "train", 64, 8, 0, 1, 7);
  const int n = static_cast<int>(probe.samples_per_epoch() / 8);  // an epoch: every shard
  EXPECT_EQ(hashes(c, remote, n), hashes(c, local, n));
  const std::string stats = test::read_text(tmp_ / "proxy_stats.json");
  EXPECT_EQ(stats.find("\"truncate\": 0,"), std::string::npos) << stats;
  EXPECT_GT(count_in(test::read_text(tmp_ / "nginx/access.log"), "\" 206 "), 0) << stats;
}

// A shard whose served bytes differ from the manifest is refused before use (DataError naming the
// URL and both checksums), and so is a shard the server does not have (404).
TEST_F(RemoteTest, BadShardOnServerIsRefusedNamingTheUrl) {
  const std::string data = make_dataset(tmp_.path(), 3000, 20000);
  const data::Manifest local = data::Manifest::load(data);
  const std::string first = local.split("train")[0].file;
  auto nginx = start_nginx(tmp_.path(), tmp_.path());
  ASSERT_TRUE(nginx->up());
  const std::string url = "http://127.0.0.1:" + std::to_string(nginx->port) + "/data";
  const DataConfig c = loader_config(tmp_ / "cache", 64);
  {  // one byte flipped in the served copy of every train shard (the first one is read first)
    for (const auto& s : local.split("train")) {
      std::string bytes = test::read_text(data + "/" + s.file);
      bytes[bytes.size() - 1] ^= 0x5a;
      test::write_text(data + "/" + s.file, bytes);
    }
    const data::Manifest remote = data::open_dataset(url, "data.train", data::remote_options(c));
    const std::string e = test::data_error([&] { hashes(c, remote, 1); });
    EXPECT_NE(e.find(url + "/train_"), std::string::npos) << e;
    EXPECT_NE(e.find("does not match manifest.json"), std::string::npos) << e;
  }
  for (const auto& s : local.split("train")) fs::remove(data + "/" + s.file);
  const data::Manifest remote = data::open_dataset(url, "data.train", data::remote_options(c));
  const std::string e = test::data_error([&] { hashes(c, remote, 1); });
  EXPECT_NE(e.find(url + "/train_"), std::string::npos) << e;
  EXPECT_NE(e.find("HTTP 404"), std::string::npos) << e;
}

// The cache's eviction: least recently used first, never a shard held (here or by another
// process: the same flock), never this run's shards ahead of the one being fetched; no room when
// every shard is held.
TEST(CacheDirTest, EvictsLeastRecentlyUsedNeverHeld) {
  TempDir tmp;
  const data::CacheDir cache(tmp / "c", 300);
  auto put = [&](const std::string& name) {
    const std::string key = data::CacheDir::key("0123456789abcdef", 100, name);
    if (!cache.reserve(key, 100, {}, 0)) return std::string();
    const int fd = cache.open_part(key);
    EXPECT_GE(fd, 0);
    EXPECT_EQ(::write(fd, std::string(100, 'x').data(), 100), 100);
    cache.commit(key, fd);
    return key;
  };
  const std::string a = put("a"), b = put("b"), c = put("c");
  ASSERT_FALSE(c.empty());
  EXPECT_EQ(cache.used(), 300u);
  auto hold_a = cache.hold(a);  // a is now the most recently used, and held
  ASSERT_TRUE(hold_a);
  const std::string d = put("d");  // evicts b (least recently used)
  EXPECT_FALSE(d.empty());
  EXPECT_FALSE(test::fs::exists(cache.path(b)));
  EXPECT_TRUE(test::fs::exists(cache.path(a)));
  auto hold_c = cache.hold(c), hold_d = cache.hold(d);
  EXPECT_TRUE(put("e").empty());  // all three held: no room
  EXPECT_EQ(cache.used(), 300u);
  hold_c.reset();
  const std::map<std::string, int> keep = {{c, 1}};
  EXPECT_FALSE(cache.reserve(data::CacheDir::key("0123456789abcdef", 100, "f"), 100, keep, 2));  // c is read first
  EXPECT_TRUE(cache.reserve(data::CacheDir::key("0123456789abcdef", 100, "f"), 100, keep, 0));   // f is read first
  EXPECT_FALSE(test::fs::exists(cache.path(c)));
}

}  // namespace
}  // namespace lm
