// Durability of what the trainer wrote: damaged checkpoints stop the run or are moved aside (never
// deleted), a re-save keeps the old checkpoint until the new one is committed, new directories are
// fsync'd, one trainer (and one launcher) per directory, and background writers hand their errors
// to the training thread. Real processes and real files; faults injected through
// files::FileSystem where a real disk cannot be made to fail on cue.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <fstream>
#include <random>

#include "common/files.h"
#include "tests/testutil.h"
#include "trainer/checkpoint/checkpoint.h"
#include "run/config/config.h"
#include "trainer/parallel/memory_check.h"
#include "run/run_dir.h"

namespace lm {
namespace {

namespace stdfs = std::filesystem;
using test::TempDir;

CheckpointState small_state(int64_t step, float fill) {
  CheckpointState st;
  st.step = step;
  st.run = {{"data_version", "v"}};
  st.replicated["progress"].values = {{"step", step}};
  st.replicated["model"].tensors = {{"w", torch::full({32, 32}, fill)}};
  st.per_rank["loader"].values = {{"cursor", step}};
  return st;
}

void flip_byte(const std::string& path, size_t at) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(static_cast<std::streamoff>(at));
  char c = 0;
  f.read(&c, 1);
  c ^= 0x20;
  f.seekp(static_cast<std::streamoff>(at));
  f.write(&c, 1);
}

std::vector<std::string> trainer_args(const std::string& run, const std::vector<std::string>& extra) {
  std::vector<std::string> a = {test::source_path("configs/tiny.yaml"), "data.train=" + test::shared_bytes_dataset(),
                                "run.dir=" + run, "model.d_model=32", "model.seq_len=32", "train.micro_batch_size=4",
                                "eval.batches=0", "train.threads=1", "log.every_steps=1", "log.tensorboard=false"};
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

size_t count_lines_with(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t p = 0; (p = text.find(what, p)) != std::string::npos; p += what.size()) ++n;
  return n;
}

// Every checkpoint of a run damaged: the trainer refuses (exit 2) naming each and why, and keeps
// them all; checkpoint.force moves them to the quarantine (saying where) and starts afresh.
TEST(Durability, NoCheckpointVerifiesStopsTheRun) {
  TempDir tmp;
  const std::string run = tmp / "run";
  auto first = test::run_bin("trainer", trainer_args(run, {"train.max_steps=6", "checkpoint.every_steps=2",
                                                           "checkpoint.keep_last=0"}));
  ASSERT_EQ(first.exit_code, 0) << first.out;
  std::vector<std::string> dirs;
  for (int s : {2, 4, 6}) {
    dirs.push_back(run_dir::checkpoint(run, s));
    flip_byte(dirs.back() + "/model.safetensors", stdfs::file_size(dirs.back() + "/model.safetensors") - 9);
  }
  auto again = test::run_bin("trainer", trainer_args(run, {"train.max_steps=8", "checkpoint.every_steps=2"}));
  EXPECT_EQ(again.exit_code, 2) << again.out;
  const std::string last = again.out.substr(again.out.rfind("trainer: error:"));
  EXPECT_EQ(last.find('\n'), last.size() - 1) << "one line: " << last;
  for (auto& d : dirs) {
    EXPECT_NE(last.find(d + " (model.safetensors: checksum mismatch)"), std::string::npos) << last;
    EXPECT_TRUE(stdfs::exists(d + "/model.safetensors")) << d << " was removed";
  }
  auto forced = test::run_bin("trainer", trainer_args(run, {"train.max_steps=8", "checkpoint.every_steps=2",
                                                            "checkpoint.force=true"}));
  EXPECT_EQ(forced.exit_code, 0) << forced.out;
  for (int s : {2, 4, 6}) {
    const std::string q = run_dir::quarantine(run) + "/" + run_dir::step_name(s);
    EXPECT_TRUE(stdfs::exists(q + "/model.safetensors")) << q;
    EXPECT_NE(forced.out.find("moved to " + q), std::string::npos) << forced.out;
  }
  EXPECT_EQ(forced.out.find("resumed from"), std::string::npos) << "started afresh";
}

// The newest checkpoint damaged: resume falls back to the one before and moves the damaged one
// aside; retention (a later process, which has not verified them) never deletes one that does
// not verify.
TEST(Durability, DamagedCheckpointsAreMovedAsideNeverDeleted) {
  TempDir run;
  CheckpointConfig all;
  all.keep_last = 0;
  {
    Checkpointer ck(all, run.path(), 0, 1);
    for (int s : {1, 2, 3}) ck.save(small_state(s, static_cast<float>(s)));
  }
  flip_byte(run_dir::checkpoint(run.path(), 3) + "/model.safetensors", 200);
  flip_byte(run_dir::checkpoint(run.path(), 1) + "/state.json", 10);
  CheckpointConfig keep2;
  keep2.keep_last = 2;
  Checkpointer ck(keep2, run.path(), 0, 1);
  CheckpointState st;
  EXPECT_EQ(ck.load_resume(&st), run_dir::checkpoint(run.path(), 2));
  const std::string q = run_dir::quarantine(run.path());
  EXPECT_FALSE(stdfs::exists(q)) << "moved only once the start is accepted";
  ck.quarantine_pending();
  EXPECT_TRUE(stdfs::exists(q + "/step_00000003/model.safetensors"));
  ck.save(small_state(3, 3.0f));
  ck.save(small_state(4, 4.0f));  // retention: keeps 4 and 3; step 2 verifies (deleted), step 1 does not
  EXPECT_FALSE(stdfs::exists(run_dir::checkpoint(run.path(), 2)));
  EXPECT_FALSE(stdfs::exists(run_dir::checkpoint(run.path(), 1)));
  EXPECT_TRUE(stdfs::exists(q + "/step_00000001/state.json")) << "a damaged checkpoint was deleted";
  EXPECT_EQ(CheckpointReader::verify(run_dir::checkpoint(run.path(), 3)), "");
}

// Counts directory fsyncs and fails chosen renames.
class DirFs : public files::FileSystem {
 public:
  std::vector<std::string> synced;
  std::string fail_rename_from_suffix;  // a rename whose source ends so fails with EIO
  bool exit_instead = false;            // ... or the process exits there (a crash)
  int rename(const char* from, const char* to) override {
    const std::string f = from;
    const auto& sfx = fail_rename_from_suffix;
    if (!sfx.empty() && f.size() >= sfx.size() && f.compare(f.size() - sfx.size(), sfx.size(), sfx) == 0) {
      if (exit_instead) ::_exit(9);
      return EIO;
    }
    return FileSystem::rename(from, to);
  }
  int sync_dir(const char* d) override {
    synced.push_back(stdfs::path(d).lexically_normal().string());
    return FileSystem::sync_dir(d);
  }
};

struct UseFs {
  explicit UseFs(files::FileSystem* fs) { files::set_file_system(fs); }
  ~UseFs() { files::set_file_system(nullptr); }
};

TEST(Durability, NewRunAndCheckpointDirectoriesAreSynced) {
  TempDir tmp;
  DirFs fs;
  UseFs use(&fs);
  Checkpointer ck(CheckpointConfig{}, tmp / "a/run", 0, 1);
  auto has = [&](const std::string& d) {
    return std::find(fs.synced.begin(), fs.synced.end(), stdfs::path(d).lexically_normal().string()) != fs.synced.end();
  };
  EXPECT_TRUE(has(tmp.path())) << "the parent of the new directory a/";
  EXPECT_TRUE(has(tmp / "a")) << "the parent of the new run directory";
  EXPECT_TRUE(has(tmp / "a/run")) << "the run directory, parent of the new checkpoints/";
}

// A re-save of an existing step whose commit rename fails keeps the old checkpoint; one that
// crashes between the renames is repaired by the next start.
TEST(Durability, ResaveKeepsTheOldCheckpointUntilTheNewIsCommitted) {
  TempDir run;
  CheckpointConfig cfg;
  cfg.on_error = "continue";
  const std::string dir = run_dir::checkpoint(run.path(), 5);
  {
    Checkpointer ck(cfg, run.path(), 0, 1);
    ck.save(small_state(5, 1.0f));
    DirFs fs;
    fs.fail_rename_from_suffix = ".tmp";
    UseFs use(&fs);
    ck.save(small_state(5, 2.0f));
    auto r = ck.finished();
    ASSERT_EQ(r.size(), 2u);
    EXPECT_NE(r[1].error.find("rename"), std::string::npos) << r[1].error;
  }
  ASSERT_EQ(CheckpointReader::verify(dir), "") << "the old step_5 was lost by a failed re-save";
  const pid_t pid = ::fork();
  if (pid == 0) {  // a trainer that dies between the two renames of a re-save
    DirFs fs;
    fs.fail_rename_from_suffix = ".tmp";
    fs.exit_instead = true;
    files::set_file_system(&fs);
    Checkpointer ck(cfg, run.path(), 0, 1);
    ck.save(small_state(5, 3.0f));
    ::_exit(0);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 9) << status;
  Checkpointer ck(cfg, run.path(), 0, 1);
  ASSERT_EQ(CheckpointReader::verify(dir), "") << "the crash lost step_5";
  auto st = ck.load(dir);
  EXPECT_TRUE(torch::equal(st.replicated["model"].all_tensors()[0].second, torch::full({32, 32}, 1.0f)));
  EXPECT_FALSE(stdfs::exists(dir + ".old"));
}

// A second trainer on a run directory in use exits 2 naming the holder's pid; so does a second
// launcher of the same node and run id.
TEST(Durability, OneTrainerAndOneLauncherPerDirectory) {
  TempDir tmp;
  const std::string run = tmp / "run";
  test::Proc first = test::spawn_bin("trainer", trainer_args(run, {"train.max_steps=100000"}), tmp / "first.log");
  ASSERT_TRUE(test::wait_until(first, [&] { return test::last_train_step(run_dir::metrics(run)) >= 1; }))
      << test::read_text(tmp / "first.log");
  auto second = test::run_bin("trainer", trainer_args(run, {"train.max_steps=5"}));
  EXPECT_EQ(second.exit_code, 2) << second.out;
  EXPECT_NE(second.out.find("in use by another trainer (pid " + std::to_string(first.process.pid()) + ","),
            std::string::npos) << second.out;
  EXPECT_EQ(count_lines_with(second.out, "\n"), 1u) << second.out;
  test::kill_proc(first, SIGTERM);
  EXPECT_EQ(test::wait_proc(first, 120), 0) << test::read_text(tmp / "first.log");

  const std::vector<std::string> launch = {"--nproc-per-node", "1", "--standalone", "--run-id", "same",
                                           "--log-dir", tmp / "logs", "--", "/bin/sleep", "60"};
  test::Proc a = test::spawn_bin("launch", launch, tmp / "launch_a.log");
  ASSERT_TRUE(test::wait_until(a, [&] { return stdfs::exists(tmp / "logs/same/launch_node0.lock"); }));
  auto b = test::run_bin("launch", launch);
  EXPECT_EQ(b.exit_code, 2) << b.out;
  EXPECT_NE(b.out.find("in use by another launch (pid " + std::to_string(a.process.pid())), std::string::npos) << b.out;
  test::kill_proc(a, SIGTERM);
  test::wait_proc(a, 60);
}

// The binaries: one line and exit 2 for an empty config, a directory, bad prep and generate numbers.
TEST(HostileInput, TrainerPrepAndGenerateRefuseWithOneLine) {
  TempDir tmp;
  auto one_line_exit2 = [](const test::RunResult& r, const std::string& want) {
    EXPECT_EQ(r.exit_code, 2) << r.out;
    EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;
    EXPECT_NE(r.out.find(want), std::string::npos) << r.out;
  };
  test::write_text(tmp / "empty.yaml", "# nothing but a comment\n\n");
  one_line_exit2(test::run_bin("trainer", {tmp / "empty.yaml"}), "key 'data.train' is not set");
  one_line_exit2(test::run_bin("trainer", {tmp.path()}), "is a directory");
  test::write_text(tmp / "in.txt", "hello world\n");
  for (const char* opt : {"--shard-tokens", "--split-seed", "--vocab-size"})
    one_line_exit2(test::run_bin("prep", {tmp / "in.txt", "--out", tmp / "o", opt, "-1"}), "expected an integer >= 0, got '-1'");
  EXPECT_FALSE(stdfs::exists(tmp / "o"));
  for (const char* t : {"nan", "inf", "-1", "x"})  // 0 is greedy
    one_line_exit2(test::run_bin("generate", {"--run", tmp / "none", "--temperature", t}), "expected a finite number >= 0");
}

// A config that cannot fit is refused before anything is allocated or written: exit 2 naming the
// estimate and the memory available; run.skip_memory_check lets it through.
TEST(HostileInput, AConfigThatCannotFitIsRefusedUpFront) {
  TempDir tmp;
  const std::string run = tmp / "run";
  auto r = test::run_bin("trainer", trainer_args(run, {"model.d_model=65536", "model.n_head=64", "model.n_layer=64"}));
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;
  EXPECT_NE(r.out.find("the config needs an estimated "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("GB available"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("run.skip_memory_check=true"), std::string::npos) << r.out;
  EXPECT_FALSE(stdfs::exists(run)) << "nothing is written for a refused config";
  auto cfg = load_config(test::source_path("configs/tiny.yaml"), {"model.d_model=65536", "model.n_head=64"});
  const auto e = estimate_memory(cfg, 258);
  EXPECT_GT(e.params, 4.0 * 2 * 12 * 65536.0 * 65536);  // 2 layers of 12 d^2 fp32 weights at least
  EXPECT_EQ(e.staging, 0.0) << "no async checkpoints, no staging buffer";
  cfg.checkpoint.async = true;
  EXPECT_DOUBLE_EQ(estimate_memory(cfg, 258).staging, 3 * e.params) << "weights and the two AdamW moments";
  EXPECT_THROW(check_memory_fits(cfg, 258, torch::Device(torch::kCPU)), ConfigError);
  cfg.run.skip_memory_check = true;
  EXPECT_NO_THROW(check_memory_fits(cfg, 258, torch::Device(torch::kCPU)));
  EXPECT_NO_THROW(check_memory_fits(load_config(test::source_path("configs/gpt2-124m.yaml"), {"train.micro_batch_size=1"}),
                                    50304, torch::Device(torch::kCPU)))
      << "the 124M model at batch 1 fits this machine's memory";
}

// Random byte flips and truncations in every file of the newest checkpoint (its manifest, state,
// tensors, the loader-state JSON of rank_0.json): each is named, resume falls back to the
// checkpoint before it, and the damaged one is moved aside.
TEST(Durability, RandomCorruptionOfAnyCheckpointFileFallsBack) {
  std::mt19937 g(7);
  for (int round = 0; round < 2; ++round) {
    const std::vector<std::string> files = {"manifest.json", "model.safetensors", "state.json", "rank_0.json"};
    for (const auto& name : files) {
      for (const bool truncate : {false, true}) {
        TempDir run;
        CheckpointConfig cfg;
        {
          Checkpointer ck(cfg, run.path(), 0, 1);
          ck.save(small_state(1, 1.0f));
          ck.save(small_state(2, 2.0f));
        }
        const std::string path = run_dir::checkpoint(run.path(), 2) + "/" + name;
        std::string bytes = test::read_text(path);
        const size_t at = g() % bytes.size();
        if (truncate)
          bytes.resize(at);
        else
          bytes[at] = static_cast<char>(bytes[at] ^ (1u << (g() % 8)));
        test::write_text(path, bytes);
        Checkpointer ck(cfg, run.path(), 0, 1);
        CheckpointState st;
        try {
          EXPECT_EQ(ck.load_resume(&st), run_dir::checkpoint(run.path(), 1)) << name << " at " << at;
          EXPECT_EQ(st.step, 1);
          ck.quarantine_pending();
          EXPECT_TRUE(stdfs::exists(run_dir::quarantine(run.path()) + "/step_00000002/" + name)) << name;
        } catch (const CheckpointError& e) {  // refused: a manifest whose version digit changed
          EXPECT_NE(std::string(e.what()).find("format version"), std::string::npos) << name << ": " << e.what();
        }
      }
    }
  }
}

}  // namespace
}  // namespace lm
