// Checkpoint saves, sync and async, and retention (see writer.h); the directory layout is in
// layout.cpp, reading and verification in reader.cpp.
#include "trainer/checkpoint/writer.h"

#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <cstring>
#include <map>
#include <thread>

#include <ATen/Parallel.h>

#include "common/test_hooks.h"
#include "common/errors.h"
#include "common/checksum.h"
#include "common/clock.h"
#include "common/parallel.h"
#include "common/files.h"
#include "common/log.h"
#include "trainer/checkpoint/layout.h"
#include "run/run_dir.h"

namespace lm {
namespace {

namespace stdfs = std::filesystem;
using Clock = clock::Steady;
using clock::ms_since;

using run_dir::step_name;
using namespace checkpoint_layout;
// Writes this rank's files of checkpoint `step` and, on rank 0, commits it. Returns "" or an
// error. No exceptions escape and nothing is logged: it also runs on the writer thread.
// kill (fault injection): SIGKILL this process right after the first file is written.
std::string write_checkpoint(const std::string& ckpt_dir, int64_t step, int rank, int world,
                             const std::vector<files::FilePlan>& plans, double timeout_s, bool kill) {
  try {
    const std::string tmp = ckpt_dir + "/" + step_name(step) + ".tmp", final_dir = ckpt_dir + "/" + step_name(step);
    std::error_code ec;
    stdfs::create_directories(tmp, ec);
    if (ec) return tmp + ": cannot create directory (" + ec.message() + ")";
    nlohmann::json mine = nlohmann::json::array();
    for (size_t i = 0; i < plans.size(); ++i) {
      files::WrittenFile wf;
      std::string err = files::try_write_plan(tmp, plans[i], &wf);
      if (!err.empty()) return err;
      mine.push_back({{"name", wf.name}, {"bytes", wf.bytes}, {"xxh64", hex64(wf.xxh64)}});
      if (kill && i == 0) ::raise(SIGKILL);
    }
    // The marker appears whole or not at all (written aside, then renamed): rank 0 reads it as
    // soon as it exists.
    const std::string marker = "rank_" + std::to_string(rank) + ".done";
    if (auto err = files::try_write_plan(tmp, {marker + ".part", mine.dump(), {}}, nullptr); !err.empty()) return err;
    if (auto err = files::try_rename(tmp + "/" + marker + ".part", tmp + "/" + marker); !err.empty()) return err;
    if (auto err = files::try_fsync_dir(tmp); !err.empty()) return err;
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
      const auto got = nlohmann::json::parse(files::read_file(marker), nullptr, false);
      if (!got.is_array()) return marker + ": not a list of files (damaged)";
      for (auto& f : got) files.push_back(f);
    }
    std::sort(files.begin(), files.end(), [](auto& a, auto& b) { return a["name"] < b["name"]; });
    nlohmann::json manifest = {{"magic", kCheckpointMagic}, {"version", kCheckpointVersion},
                               {"step", step}, {"world_size", world}, {"files", files}};
    files::FilePlan mp{run_dir::kCheckpointManifest, manifest.dump(2) + "\n", {}};
    if (auto err = files::try_write_plan(tmp, mp, nullptr); !err.empty()) return err;
    for (int r = 0; r < world; ++r) files::file_system().remove((tmp + "/rank_" + std::to_string(r) + ".done").c_str());
    if (auto err = files::try_fsync_dir(tmp); !err.empty()) return err;
    return commit_dir(ckpt_dir, tmp, final_dir);
  } catch (const std::exception& e) {
    return e.what();
  }
}

}  // namespace

// The save in flight: the writer thread, the staging copies it makes first, and its outcome.
// The copies are claimed by the writer thread (at idle priority, so it only takes CPU time
// training leaves free) and by the training thread's wait_snapshot(), so whatever is not copied
// by the next update is copied by the thread that waits for it.
//
// The writer's priority (common/parallel.h, IdlePriority): idle for the copy only, the one part of
// its work whose waiter does the work itself. Whoever waits for the writer raises it to normal
// priority first: wait_snapshot() (the chunks the writer claimed), wait() (a due save while the
// previous one is in flight, the end of the run, a signal's stop, the destructor). The writes run
// at normal priority from their start: they have a deadline (the next save; with write_pace, their
// pace) and keep their pace by sleeping, not by waiting for idle CPU. At idle priority beside two
// ordinary busy processes (other ranks, loader threads, a neighbour's job) a save paced over 5 s
// of a 10 s interval took 32.8 s and never slept (issue 39): a save that takes three intervals widens what a
// crash loses and makes the next save wait for it. What this costs training where it has the
// cores to itself: the writes' own CPU time (the checksum, about 0.1 ms a MB, and the writes'
// system time), spread over the pace in pieces of a millisecond or so, instead of only the idle
// time between its threads' work (bench/async_busy.sh compares async and sync on a busy machine).
struct CheckpointWriter::InFlight {
  std::thread thread;
  std::vector<torch::Tensor> keep;  // the copies' sources and the staging buffer
  ChunkedCopy copies;               // host state into the staging buffer
  std::atomic<bool> done{false};    // the writer finished; report.error and write_ms are set
  SaveReport report;
  double fence_s = 0;               // time wait_snapshot() waited for (or made) the copies
  Pacer pacer;                      // the writes' pace (hurried by wait())
  IdlePriority priority;            // the writer's (raised by whoever waits for it)
  clock::StealMeter steal;          // the hypervisor's steal from save() on
};

CheckpointWriter::CheckpointWriter(const CheckpointConfig& cfg, const std::string& run_dir, int rank, int world,
                                   CheckpointReader& reader, SaveInterval& policy)
    : cfg_(cfg), ckpt_dir_(run_dir::checkpoints(run_dir)), rank_(rank), world_(world), reader_(reader), policy_(policy) {
  files::make_dirs(ckpt_dir_);
  if (rank_ == 0) {
    recover_resaves(ckpt_dir_);
    std::error_code ec;
    for (auto& e : stdfs::directory_iterator(ckpt_dir_, ec)) {
      const std::string name = e.path().filename().string();
      if (name.size() > 4 && name.compare(name.size() - 4, 4, ".tmp") == 0) {
        log::warn("removing an interrupted checkpoint: " + e.path().string());
        files::remove_all(e.path().string());
      }
      const size_t d = std::strlen(kDeleteSuffix);
      if (name.size() > d && name.compare(name.size() - d, d, kDeleteSuffix) == 0) {
        log::info("finishing the removal of an old checkpoint: " + e.path().string());
        files::remove_all(e.path().string());
      }
    }
  }
}

CheckpointWriter::~CheckpointWriter() { wait(); }

void CheckpointWriter::wait() {
  if (!inflight_) return;
  const auto t0 = Clock::now();
  inflight_->pacer.hurry();  // someone waits: the rest at full speed, as unpaced
  inflight_->priority.raise(inflight_->thread.native_handle());  // and at normal priority
  inflight_->thread.join();
  close_inflight(ms_since(t0) / 1e3);  // waiting for the writer blocks training too
}

void CheckpointWriter::wait_snapshot() {
  // Called every step: nothing to do once the copy is made, while the writer writes.
  if (!inflight_ || inflight_->copies.done()) return;
  const auto t0 = Clock::now();
  // The writer may hold a chunk this thread will wait for: at normal priority from now on (its
  // writes would be anyway).
  inflight_->priority.raise(inflight_->thread.native_handle());
  // Every intra-op thread is free while the training thread waits here: all of them copy.
  at::parallel_for(0, at::get_num_threads(), 1, [this](int64_t, int64_t) { inflight_->copies.copy_some(); });
  inflight_->copies.wait();
  inflight_->fence_s += ms_since(t0) / 1e3;
}

void CheckpointWriter::step_done(double step_s) {
  stall_.step(step_s, inflight_ != nullptr);
  if (inflight_ && inflight_->done.load()) {
    inflight_->thread.join();
    close_inflight(0);
  }
}

// The in-flight save is over (its thread joined): its stall measured, its report recorded.
// extra_s: time the loop waited for it outside any step.
void CheckpointWriter::close_inflight(double extra_s) {
  SaveReport r = inflight_->report;
  r.steal_ms = 1e3 * inflight_->steal.take_s();
  r.block_ms = r.call_ms + 1e3 * (stall_.take(inflight_->fence_s) + extra_s);
  inflight_.reset();
  record(std::move(r));
}

void CheckpointWriter::record(SaveReport r) {
  // A failed save leaves no half-written directory taking the space the next attempt needs.
  if (!r.error.empty() && rank_ == 0) files::remove_all(ckpt_dir_ + "/" + step_name(r.step) + ".tmp");
  if (r.error.empty() && rank_ == 0) {
    policy_.record_cost(r.block_ms / 1e3);
    reader_.mark_verified(r.step);
    try {  // nothing escapes: a failed retention never fails the save
      prune();
    } catch (const std::exception& e) {
      log::warn(std::string("checkpoint retention: ") + e.what());
    }
  }
  done_.push_back(std::move(r));
}

std::vector<SaveReport> CheckpointWriter::finished() {
  std::vector<SaveReport> out;
  out.swap(done_);
  return out;
}

void CheckpointWriter::report(const std::string& other_error, const std::function<void(const SaveReport&)>& saved) {
  auto failed = [&](const std::string& err) {
    if (cfg_.stop_on_error()) throw Error(err);
    log::warn(err + " (checkpoint.on_error: continue, training goes on)");
  };
  if (!other_error.empty()) failed(other_error);
  for (auto& r : finished()) {
    if (!r.error.empty()) failed("checkpoint at step " + std::to_string(r.step) + " failed: " + r.error);
    else saved(r);
  }
}

namespace {

// The pieces the writer paces (Pacer::piece_done, through yield_if_background): the checksum's
// pieces, 1 MB each (common/files.cpp, PlanWriter::hash), about one per MB of each file.
double pace_pieces(const std::vector<files::FilePlan>& plans) {
  constexpr uint64_t kPiece = uint64_t{1} << 20;
  double n = 0;
  for (auto& p : plans) n += static_cast<double>((p.size() + kPiece - 1) / kPiece);
  return n;
}

double plans_mb(const std::vector<files::FilePlan>& plans) {
  double mb = 0;
  for (auto& p : plans) mb += static_cast<double>(p.size()) / 1e6;
  return mb;
}

const std::map<std::string, std::string> kTensorFileMeta = {{"format", "pt"}};

// A rank's tensor files: rank 0's one per replicated component that has tensors, named after its
// key; every rank's part of each sharded component.
std::string tensor_file(const std::string& key) { return key + ".safetensors"; }
std::string part_file(const std::string& key, int rank) { return key + ".part_" + std::to_string(rank) + ".safetensors"; }
TensorFiles tensor_files(const CheckpointState& st, int rank) {
  TensorFiles tfiles;
  if (rank == 0)
    for (auto& [key, c] : st.replicated)
      if (!c.tensors.empty()) tfiles.emplace_back(tensor_file(key), c.tensors);
  for (auto& [key, c] : st.sharded) tfiles.emplace_back(part_file(key, rank), c.tensors);
  return tfiles;
}

}  // namespace

void CheckpointWriter::prepare(const CheckpointState& st) {
  if (!cfg_.async) return;
  const TensorFiles tfiles = tensor_files(st, rank_);
  if (!tfiles.empty()) staging_.prepare(tfiles, kTensorFileMeta);
}

// This rank's files as write plans. Sync (f null): the tensor files' spans point into the state's
// own memory (kept alive through *keep). Async: they are images in the staging buffer, filled by
// f->copies (staging.h).
std::vector<files::FilePlan> CheckpointWriter::plan_files(const CheckpointState& st, std::vector<torch::Tensor>* keep,
                                                      InFlight* f) {
  std::vector<files::FilePlan> plans;
  const TensorFiles tfiles = tensor_files(st, rank_);
  if (f && !tfiles.empty()) {
    plans = staging_.stage(tfiles, kTensorFileMeta, &f->copies, keep);
  } else {
    for (auto& [name, tensors] : tfiles) {
      auto tp = plan_safetensors(name, tensors, kTensorFileMeta);
      keep->insert(keep->end(), tp.keep.begin(), tp.keep.end());
      plans.push_back(std::move(tp.plan));
    }
  }
  if (rank_ == 0) {
    nlohmann::json values = nlohmann::json::object(), file_of = nlohmann::json::object();
    nlohmann::json parts_of = nlohmann::json::object();
    for (auto& [key, c] : st.replicated) {
      values[key] = c.values;
      if (!c.tensors.empty()) file_of[key] = tensor_file(key);
    }
    for (auto& [key, c] : st.sharded) {  // the values are the same on every rank: rank 0's
      values[key] = c.values;
      for (int r = 0; r < world_; ++r) parts_of[key].push_back(part_file(key, r));
    }
    nlohmann::json state = {{"magic", kCheckpointMagic}, {"version", kCheckpointVersion}, {"step", st.step},
                            {"world_size", world_}, {"run", st.run}, {"components", values},
                            {"tensor_files", file_of}};
    if (!parts_of.empty()) state["part_files"] = parts_of;
    plans.push_back({"state.json", state.dump(2) + "\n", {}});
  }
  nlohmann::json mine = nlohmann::json::object();
  for (auto& [key, c] : st.per_rank) {
    if (!c.tensors.empty()) throw Error("checkpoint: per-rank component '" + key + "' has tensors (unsupported)");
    mine[key] = c.values;
  }
  plans.push_back({"rank_" + std::to_string(rank_) + ".json",
                   nlohmann::json{{"rank", rank_}, {"components", mine}}.dump(2) + "\n", {}});
  return plans;
}

void CheckpointWriter::save(const CheckpointState& st) {
  wait();  // at most one in flight; the wait is counted as the previous save's stall
  const auto t0 = Clock::now();
  const bool kill = test_hooks().kill_in_save_step > 0 && test_hooks().kill_in_save_step == st.step;
  policy_.saved(st.step);
  const std::string dir = ckpt_dir_ + "/" + step_name(st.step);
  if (!cfg_.async) {
    clock::StealMeter steal;
    std::vector<torch::Tensor> keep;
    const auto plans = plan_files(st, &keep, nullptr);
    const double mb = plans_mb(plans);
    policy_.set_state_mb(mb);
    std::string err = write_checkpoint(ckpt_dir_, st.step, rank_, world_, plans, cfg_.commit_timeout_s, kill);
    const double ms = ms_since(t0);
    record({st.step, dir, false, ms, ms, ms, mb, 1e3 * steal.take_s(), 0, 0, err});
    if (!err.empty() && cfg_.stop_on_error()) throw Error("checkpoint at step " + std::to_string(st.step) + " failed: " + err);
    return;
  }
  auto f = std::make_unique<InFlight>();
  auto plans = plan_files(st, &f->keep, f.get());
  const double mb = plans_mb(plans);
  policy_.set_state_mb(mb);
  f->report = {st.step, dir, true, 0, 0, 0, mb, 0, 0, 0, ""};
  f->report.pace_ms = 1e3 * pace_target_s();
  InFlight* fl = f.get();
  inflight_ = std::move(f);
  fl->thread = std::thread([this, fl, plans = std::move(plans), kill, step = st.step] {
    const auto w0 = Clock::now();
    pthread_setname_np(pthread_self(), "ckpt-writer");  // as top and perf show it
    t_background = &fl->priority;
    fl->priority.lower();  // for the copy; refused (parallel.h): at normal priority, yielding
    fl->copies.copy_some();
    fl->copies.wait();
    fl->priority.raise(pthread_self());  // the writes: normal priority, paced by sleeping (above)
    fl->pacer.start(pace_pieces(plans), fl->report.pace_ms / 1e3);  // the writes, paced (the copy never is)
    t_pacer = &fl->pacer;
    fl->report.error = write_checkpoint(ckpt_dir_, step, rank_, world_, plans, cfg_.commit_timeout_s, kill);
    t_pacer = nullptr;
    fl->report.slept_ms = 1e3 * fl->pacer.slept_s();
    fl->report.write_ms = ms_since(w0);
    t_background = nullptr;
    fl->done.store(true);
  });
  fl->report.call_ms = ms_since(t0);
}

double CheckpointWriter::pace_target_s() const {
  return std::max(0.0, cfg_.write_pace) * static_cast<double>(policy_.steps_between_saves()) * policy_.mean_step_s();
}

void CheckpointWriter::prune() {
  if (cfg_.keep_last <= 0) return;
  auto all = run_dir::list_checkpoints(ckpt_dir_);
  for (size_t i = static_cast<size_t>(cfg_.keep_last); i < all.size(); ++i) {
    const int64_t step = all[i].first;
    if (cfg_.keep_every > 0 && step % cfg_.keep_every == 0) continue;
    // Deleted only when known to verify (written or loaded by this process, or checked now);
    // one that does not verify is moved aside, never deleted.
    const bool known = reader_.known_to_verify(step);
    const std::string why = known ? "" : CheckpointReader::verify(all[i].second);
    if (why.empty()) {
      // Out of sight first (durably), then removed: a crash mid-removal leaves step_N.deleting,
      // never a step_N missing files (which the next start would take for a damaged checkpoint).
      const std::string aside = all[i].second + kDeleteSuffix;
      if (auto err = files::try_rename(all[i].second, aside); !err.empty()) throw Error("cannot remove an old checkpoint: " + err);
      files::fsync_dir(ckpt_dir_);
      files::remove_all(aside);
    } else
      reader_.quarantine(all[i].second, why);
  }
}

}  // namespace lm
