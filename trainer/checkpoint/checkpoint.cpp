// Checkpoint layout, commit protocol, verification, retention, sync/async saves (see checkpoint.h).
#include "trainer/checkpoint/checkpoint.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <cstring>
#include <map>

#include "common/errors.h"
#include "common/checksum.h"
#include "common/files.h"
#include "common/log.h"

namespace lm {
namespace {

namespace stdfs = std::filesystem;
using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }

std::string step_name(int64_t step) { return strf("step_%08lld", static_cast<long long>(step)); }

// Committed checkpoint directories (step_<digits>), newest first.
std::vector<std::pair<int64_t, std::string>> list_checkpoints(const std::string& ckpt_dir) {
  std::vector<std::pair<int64_t, std::string>> out;
  std::error_code ec;
  for (auto& e : stdfs::directory_iterator(ckpt_dir, ec)) {
    const std::string name = e.path().filename().string();
    if (!e.is_directory() || name.size() != 13 || name.rfind("step_", 0) != 0) continue;
    if (name.find_first_not_of("0123456789", 5) != std::string::npos) continue;
    out.emplace_back(std::stoll(name.substr(5)), e.path().string());
  }
  std::sort(out.begin(), out.end(), [](auto& a, auto& b) { return a.first > b.first; });
  return out;
}

// Writes this rank's files of checkpoint `step` and, on rank 0, commits it. Returns "" or an
// error. No exceptions escape and nothing is logged: it also runs in a forked child.
// kill (fault injection): SIGKILL `also` (the trainer, when this is its forked writer; 0 = none)
// and this process right after the first file is written.
std::string write_checkpoint(const std::string& ckpt_dir, int64_t step, int rank, int world,
                             const std::vector<files::FilePlan>& plans, double timeout_s, bool kill,
                             pid_t also = 0) {
  try {
    const std::string tmp = ckpt_dir + "/" + step_name(step) + ".tmp", final_dir = ckpt_dir + "/" + step_name(step);
    std::error_code ec;
    stdfs::create_directories(tmp, ec);
    if (ec) return tmp + ": cannot create directory (" + ec.message() + ")";
    nlohmann::json mine = nlohmann::json::array();
    for (size_t i = 0; i < plans.size(); ++i) {
      files::WrittenFile wf;
      std::string err = files::write_plan(tmp, plans[i], &wf);
      if (!err.empty()) return err;
      mine.push_back({{"name", wf.name}, {"bytes", wf.bytes}, {"xxh64", hex64(wf.xxh64)}});
      if (kill && i == 0) {
        if (also > 0) ::kill(also, SIGKILL);
        ::raise(SIGKILL);
      }
    }
    files::FilePlan done{"rank_" + std::to_string(rank) + ".done", mine.dump(), {}};
    if (auto err = files::write_plan(tmp, done, nullptr); !err.empty()) return err;
    files::fsync_dir(tmp);
    if (rank != 0) return "";
    // Rank 0: wait for every rank's files, then the manifest, then the rename.
    nlohmann::json files = nlohmann::json::array();
    const auto t0 = Clock::now();
    for (int r = 0; r < world; ++r) {
      const std::string marker = tmp + "/rank_" + std::to_string(r) + ".done";
      while (!files::exists(marker)) {
        if (ms_since(t0) > timeout_s * 1e3)
          return marker + ": rank " + std::to_string(r) + " did not finish its checkpoint files in time";
        ::usleep(20000);
      }
      for (auto& f : nlohmann::json::parse(files::read_file(marker))) files.push_back(f);
    }
    std::sort(files.begin(), files.end(), [](auto& a, auto& b) { return a["name"] < b["name"]; });
    nlohmann::json manifest = {{"magic", kCheckpointMagic}, {"version", kCheckpointVersion},
                               {"step", step}, {"world_size", world}, {"files", files}};
    files::FilePlan mp{"manifest.json", manifest.dump(2) + "\n", {}};
    if (auto err = files::write_plan(tmp, mp, nullptr); !err.empty()) return err;
    for (int r = 0; r < world; ++r) ::unlink((tmp + "/rank_" + std::to_string(r) + ".done").c_str());
    files::fsync_dir(tmp);
    if (files::exists(final_dir)) files::remove_all(final_dir);  // a re-save of the same step
    if (std::rename(tmp.c_str(), final_dir.c_str()) != 0)
      return final_dir + ": rename failed (" + std::string(std::strerror(errno)) + ")";
    files::fsync_dir(ckpt_dir);
    return "";
  } catch (const std::exception& e) {
    return e.what();
  }
}

}  // namespace

// The save in flight: a waiter thread (async) and what it must keep alive.
struct Checkpointer::InFlight {
  std::thread thread;
  std::vector<torch::Tensor> keep;
};

Checkpointer::Checkpointer(const CheckpointConfig& cfg, const std::string& run_dir, int rank, int world)
    : cfg_(cfg), ckpt_dir_(run_dir + "/checkpoints"), rank_(rank), world_(world) {
  files::make_dirs(ckpt_dir_);
  if (rank_ == 0) {
    std::error_code ec;
    for (auto& e : stdfs::directory_iterator(ckpt_dir_, ec)) {
      const std::string name = e.path().filename().string();
      if (name.size() > 4 && name.compare(name.size() - 4, 4, ".tmp") == 0) {
        log::warn("removing an interrupted checkpoint: " + e.path().string());
        files::remove_all(e.path().string());
      }
    }
  }
}

Checkpointer::~Checkpointer() { wait(); }

void Checkpointer::wait() {
  if (inflight_ && inflight_->thread.joinable()) inflight_->thread.join();
  inflight_.reset();
}

void Checkpointer::record(SaveReport r) {
  if (r.error.empty() && rank_ == 0) {
    last_cost_s_ = (r.async ? r.block_ms : r.write_ms) / 1e3;
    prune();
  }
  std::lock_guard<std::mutex> lock(mu_);
  done_.push_back(std::move(r));
}

std::vector<SaveReport> Checkpointer::finished() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<SaveReport> out;
  out.swap(done_);
  return out;
}

void Checkpointer::save(const CheckpointState& st) {
  const auto t0 = Clock::now();
  wait();  // at most one in flight; waiting counts as blocked time
  const char* kill_env = std::getenv("LM_FAULT_KILL_IN_SAVE");
  const bool kill = kill_env && std::atoll(kill_env) == st.step;

  // The files of this rank, as plans pointing into tensor memory.
  std::vector<SafetensorsPlan> tensor_plans;
  std::vector<files::FilePlan> plans;
  const bool on_cpu = std::all_of(st.model.begin(), st.model.end(), [](auto& p) { return p.second.is_cpu(); });
  const bool use_fork = cfg_.async && on_cpu;
  auto host = [&](const NamedTensors& ts) {
    if (!cfg_.async || use_fork) return ts;  // sync, or fork: the child sees a frozen snapshot
    NamedTensors copy;                       // thread: copy to host memory now
    for (auto& [n, t] : ts) copy.emplace_back(n, t.detach().to(torch::kCPU, /*non_blocking=*/false, /*copy=*/true));
    return copy;
  };
  if (rank_ == 0) {
    tensor_plans.push_back(plan_safetensors("model.safetensors", host(st.model), {{"format", "pt"}}));
    tensor_plans.push_back(plan_safetensors("optimizer.safetensors", host(st.optimizer)));
    if (!st.ema.empty()) tensor_plans.push_back(plan_safetensors("ema.safetensors", host(st.ema), {{"format", "pt"}}));
    nlohmann::json state = st.state;
    state["magic"] = kCheckpointMagic;
    state["version"] = kCheckpointVersion;
    state["step"] = st.step;
    state["world_size"] = world_;
    for (auto& tp : tensor_plans) plans.push_back(tp.plan);
    plans.push_back({"state.json", state.dump(2) + "\n", {}});
  }
  plans.push_back({"rank_" + std::to_string(rank_) + ".json", st.rank_state.dump(2) + "\n", {}});
  double mb = 0;
  for (auto& p : plans) mb += p.size() / 1e6;
  state_mb_ = mb;
  last_save_step_ = st.step;
  const std::string dir = ckpt_dir_ + "/" + step_name(st.step);

  if (!cfg_.async) {
    const auto w0 = Clock::now();
    std::string err = write_checkpoint(ckpt_dir_, st.step, rank_, world_, plans, cfg_.commit_timeout_s, kill);
    SaveReport r{st.step, dir, false, 0, ms_since(w0), mb, err};
    r.block_ms = ms_since(t0);
    record(r);
    if (!err.empty() && cfg_.on_error == "stop") throw Error("checkpoint at step " + std::to_string(st.step) + " failed: " + err);
    return;
  }
  inflight_ = std::make_unique<InFlight>();
  for (auto& tp : tensor_plans) inflight_->keep.insert(inflight_->keep.end(), tp.keep.begin(), tp.keep.end());
  const auto w0 = Clock::now();
  if (use_fork) {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) throw Error("checkpoint: pipe failed");
    const pid_t parent = ::getpid();
    const pid_t pid = ::fork();
    if (pid < 0) throw Error("checkpoint: fork failed (" + std::string(std::strerror(errno)) + ")");
    if (pid == 0) {  // child: write from the copy-on-write snapshot, report, exit
      ::close(fds[0]);
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(1);
      std::string err = write_checkpoint(ckpt_dir_, st.step, rank_, world_, plans, cfg_.commit_timeout_s, kill, parent);
      if (!err.empty() && ::write(fds[1], err.data(), err.size()) < 0) {}
      ::_exit(err.empty() ? 0 : 1);
    }
    ::close(fds[1]);
    const double block = ms_since(t0);
    inflight_->thread = std::thread([this, pid, fd = fds[0], dir, mb, block, w0, step = st.step] {
      std::string err;
      char buf[512];
      ssize_t n;
      while ((n = ::read(fd, buf, sizeof buf)) > 0) err.append(buf, static_cast<size_t>(n));
      ::close(fd);
      int status = 0;
      ::waitpid(pid, &status, 0);
      if (err.empty() && !(WIFEXITED(status) && WEXITSTATUS(status) == 0)) err = "checkpoint writer process failed";
      record({step, dir, true, block, ms_since(w0), mb, err});
    });
  } else {
    const double block = ms_since(t0);
    inflight_->thread = std::thread([this, plans, dir, mb, block, w0, kill, step = st.step] {
      std::string err = write_checkpoint(ckpt_dir_, step, rank_, world_, plans, cfg_.commit_timeout_s, kill);
      record({step, dir, true, block, ms_since(w0), mb, err});
    });
  }
}

bool Checkpointer::due(int64_t step, double step_s) {
  if (cfg_.every_steps > 0) return step % cfg_.every_steps == 0;
  if (cfg_.every_steps == 0 || step_s <= 0) return false;
  // Young/Daly: the interval that minimises lost work plus save cost, sqrt(2 * MTBF * C).
  const double cost_s = last_cost_s_ >= 0 ? last_cost_s_ : std::max(0.05, state_mb_ / 200.0);
  const double interval_s = std::sqrt(2.0 * cfg_.mtbf_hours * 3600.0 * cost_s);
  const int64_t interval = std::max<int64_t>(1, std::llround(interval_s / step_s));
  if (interval != auto_interval_ && rank_ == 0)
    log::info(strf("checkpoint interval: %lld steps (Young/Daly: save cost %.3f s, MTBF %.1f h, %.3f s/step)",
                   (long long)interval, cost_s, cfg_.mtbf_hours, step_s));
  auto_interval_ = interval;
  return step - last_save_step_ >= interval;
}

void Checkpointer::prune() {
  if (cfg_.keep_last <= 0) return;
  auto all = list_checkpoints(ckpt_dir_);
  for (size_t i = static_cast<size_t>(cfg_.keep_last); i < all.size(); ++i) {
    const int64_t step = all[i].first;
    if (cfg_.keep_every > 0 && step % cfg_.keep_every == 0) continue;
    files::remove_all(all[i].second);
  }
}

namespace {

// manifest.json's files: name -> {bytes, xxh64}. "" in *why when the manifest is valid and every
// file it lists exists with its size (a cheap check); checksums are left to the reader.
std::map<std::string, std::pair<uint64_t, std::string>> read_manifest(const std::string& dir, std::string* why) {
  std::map<std::string, std::pair<uint64_t, std::string>> files;
  nlohmann::json m;
  try {
    m = nlohmann::json::parse(files::read_file(dir + "/manifest.json"));
  } catch (const std::exception& e) {
    *why = "no readable manifest.json (" + std::string(e.what()) + ")";
    return files;
  }
  try {
    if (m.at("magic") != kCheckpointMagic) {
      *why = "manifest.json: not a checkpoint manifest (bad magic)";
      return files;
    }
    if (m.at("version") != kCheckpointVersion) {
      *why = "manifest.json: format version " + m.at("version").dump() + ", this build reads " +
             std::to_string(kCheckpointVersion);
      return files;
    }
    for (auto& f : m.at("files")) {
      const std::string name = f.at("name").get<std::string>(), path = dir + "/" + name;
      std::error_code ec;
      auto size = stdfs::file_size(path, ec);
      if (ec) {
        *why = path + ": missing";
        return files;
      }
      if (size != f.at("bytes").get<uint64_t>()) {
        *why = path + ": size differs from manifest.json";
        return files;
      }
      files[name] = {size, f.at("xxh64").get<std::string>()};
    }
  } catch (const std::exception& e) {
    *why = "manifest.json: " + std::string(e.what());
  }
  return files;
}

}  // namespace

std::string Checkpointer::verify(const std::string& dir) {
  std::string why;
  for (auto& [name, f] : read_manifest(dir, &why)) {
    if (!why.empty()) break;
    if (hex64(xxh64_file(dir + "/" + name)) != f.second) return dir + "/" + name + ": checksum mismatch";
  }
  return why;
}

std::string Checkpointer::load_resume(CheckpointState* out) {
  if (cfg_.resume == "none") return "";
  if (cfg_.resume != "auto") {
    try {
      *out = load(cfg_.resume);
    } catch (const CheckpointError& e) {
      throw CheckpointError("checkpoint.resume=" + cfg_.resume + ": " + e.what());
    }
    return cfg_.resume;
  }
  for (auto& [step, dir] : list_checkpoints(ckpt_dir_)) {
    try {
      *out = load(dir);
      return dir;
    } catch (const CheckpointError& e) {
      log::warn("skipping checkpoint " + dir + ": " + e.what());
    }
  }
  return "";
}

CheckpointState Checkpointer::load(const std::string& dir) {
  std::string why;
  const auto files = read_manifest(dir, &why);
  if (!why.empty()) throw CheckpointError(why);
  // Every file is checked against the manifest's checksum in the same pass that reads it.
  auto read_json = [&](const std::string& name) {
    const std::string path = dir + "/" + name;
    auto it = files.find(name);
    if (it == files.end()) throw CheckpointError(path + ": not listed in manifest.json");
    std::string bytes;
    try {
      bytes = files::read_file(path);
    } catch (const DataError& e) {
      throw CheckpointError(e.what());
    }
    if (hex64(xxh64(bytes.data(), bytes.size())) != it->second.second) throw CheckpointError(path + ": checksum mismatch");
    try {
      return nlohmann::json::parse(bytes);
    } catch (const std::exception& e) {
      throw CheckpointError(path + ": " + e.what());
    }
  };
  auto read_tensors = [&](const std::string& name) {
    auto it = files.find(name);
    if (it == files.end()) throw CheckpointError(dir + "/" + name + ": not listed in manifest.json");
    return load_safetensors(dir + "/" + name, nullptr, it->second.second);
  };
  CheckpointState st;
  st.state = read_json("state.json");
  if (st.state.value("magic", "") != kCheckpointMagic || st.state.value("version", 0) != kCheckpointVersion)
    throw CheckpointError(dir + "/state.json: not a version " + std::to_string(kCheckpointVersion) + " checkpoint");
  st.model = read_tensors("model.safetensors");
  st.optimizer = read_tensors("optimizer.safetensors");
  if (files.count("ema.safetensors")) st.ema = read_tensors("ema.safetensors");
  // A rank the checkpoint did not have (the world grew) takes rank 0's file: its loader cursor is
  // global; its "rank" field tells the trainer the RNG state is not its own.
  const std::string mine = "rank_" + std::to_string(rank_) + ".json";
  st.rank_state = read_json(files.count(mine) ? mine : "rank_0.json");
  st.step = last_save_step_ = st.state.at("step").get<int64_t>();
  return st;
}

}  // namespace lm
