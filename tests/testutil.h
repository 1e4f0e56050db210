// Helpers shared by the test suites: temp directories, running real binaries, small corpora.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/errors.h"
#include "common/process.h"
#include "data/loader/data_config.h"
#include "models/model_config.h"

namespace lm::test {

// c with data.train = dir: the one-source form the config loader makes of data.train.
inline DataConfig train_form(DataConfig c, const std::string& dir) {
  set_train(c, dir);
  return c;
}

// A 2-layer, d 32, T 16 GPT shape: the model tests' default.
inline ModelConfig tiny_model() {
  ModelConfig c;
  c.n_layer = 2;
  c.n_head = 2;
  c.d_model = 32;
  c.seq_len = 16;
  return c;
}

// tiny_model() as a Llama: 4 query heads sharing 2 key/value heads, SwiGLU width a multiple of 16.
inline ModelConfig tiny_llama_model() {
  auto c = tiny_model();
  c.arch = "llama";
  c.n_head = 4;
  c.n_kv_head = 2;
  c.ffn_multiple_of = 16;
  return c;
}

// A fresh empty directory under $TMPDIR (or /tmp), removed by the destructor.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

struct RunResult {
  int exit_code = -1;  // exit status, or 128+signal when killed
  std::string out;     // stdout and stderr together
};

// Runs `bin` (a name in build/bin, or a path) with args (no shell) and waits for it; stdin from
// /dev/null unless `stdin_text` is non-empty.
RunResult run_bin(const std::string& bin, const std::vector<std::string>& args,
                  const std::string& stdin_text = "");
std::string bin_path(const std::string& name);

// A child process started in the background; stdout and stderr go to `log`.
struct Proc {
  Process process;
  std::string log;
};
// `env` entries ("NAME=value") are added to this process's environment.
Proc spawn_bin(const std::string& bin, const std::vector<std::string>& args, const std::string& log,
               const std::vector<std::string>& env = {});
// Sends `sig` to p (no-op once it was waited for).
void kill_proc(const Proc& p, int sig);
// Waits up to timeout_s (then SIGKILLs it) and returns the exit code, or 128+signal.
int wait_proc(Proc& p, double timeout_s = 300);
// Polls `done` until it returns true (then true), or until `p` exited or timeout_s passed (false).
bool wait_until(const Proc& p, const std::function<bool()>& done, double timeout_s = 60);
// The largest "step" of the train records in a metrics.jsonl (0 when none).
int64_t last_train_step(const std::string& metrics_path);
std::string source_path(const std::string& rel);
void write_text(const std::string& path, const std::string& text);
// The whole file; throws std::runtime_error naming it when it cannot be opened (a missing file is
// never read as "", so two missing files never compare equal).
std::string read_text(const std::string& path);
// A free TCP port on 127.0.0.1 (bound and released).
int free_port();
// The environment of rank `rank` of a `world`-process group as torchrun gives it (rendezvous on
// 127.0.0.1:port), with OMP_NUM_THREADS=1; world 1: OMP_NUM_THREADS=1 only (the trainer runs alone).
std::vector<std::string> rank_env(int rank, int world, int port);
// Runs `prep` on synthetic_corpus(lines) with the bytes tokenizer into DIR/data; returns that path.
std::string make_bytes_dataset(const std::string& dir, int lines = 3000);
// A bytes dataset of synthetic_corpus(3000) made once per test process (removed at exit).
const std::string& shared_bytes_dataset();
// metrics.jsonl records of one kind ("train", "val", ...); throws naming the file when it is missing.
std::vector<std::string> metrics_of_kind(const std::string& path, const std::string& kind);
// The message of the DataError that fn() throws; a test failure when it throws none.
template <class Fn>
std::string data_error(Fn fn) {
  try {
    fn();
  } catch (const DataError& e) {
    return e.what();
  }
  ADD_FAILURE() << "no DataError";
  return "";
}

// "" unless `out` (a Python torch peer's output) shows its TCPStore refused for want of libuv: Debian
// 13's python3-torch 2.6 is built without libuv, yet its torchrun (static and c10d rendezvous) and
// its agent-store clients ask for it whatever USE_LIBUV says, so the Python peer cannot meet there.
// Then the reason to skip with (our own stores fall back: compat::tcp_store).
std::string python_torch_lacks_libuv(const std::string& out);

// A small deterministic English-like corpus of `lines` lines (one document per line).
std::string synthetic_corpus(int lines, unsigned seed = 1);

}  // namespace lm::test
