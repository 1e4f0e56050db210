// Checkpoint layout, commit protocol, verification, retention, sync/async saves (see checkpoint.h).
#include "trainer/checkpoint/checkpoint.h"

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
#include <mutex>

#include <ATen/Parallel.h>

#include "common/errors.h"
#include "common/checksum.h"
#include "common/clock.h"
#include "common/parallel.h"
#include "common/files.h"
#include "common/log.h"
#include "trainer/run_dir.h"

namespace lm {
namespace {

namespace stdfs = std::filesystem;
using Clock = clock::Steady;
using clock::ms_since;

using run_dir::step_name;
constexpr const char* kResaveSuffix = ".old";  // step_N.old: the checkpoint a re-save replaces
// step_N.deleting: a checkpoint retention is removing (renamed first: a crash mid-removal never
// leaves a half-deleted step_N that looks committed; the next Checkpointer finishes the removal).
constexpr const char* kDeleteSuffix = ".deleting";

// Committed checkpoint directories (step_<digits>), newest first.
std::vector<std::pair<int64_t, std::string>> list_checkpoints(const std::string& ckpt_dir) {
  std::vector<std::pair<int64_t, std::string>> out;
  std::error_code ec;
  for (auto& e : stdfs::directory_iterator(ckpt_dir, ec)) {
    const int64_t step = run_dir::parse_step_name(e.path().filename().string());
    if (e.is_directory() && step >= 0) out.emplace_back(step, e.path().string());
  }
  std::sort(out.begin(), out.end(), [](auto& a, auto& b) { return a.first > b.first; });
  return out;
}

// Renames the finished `tmp` to `final_dir` and makes it durable. A re-save of the same step moves
// the old directory aside (step_N.old) and removes it only once the new one is committed: a crash
// in between leaves one of them complete, and the next Checkpointer puts it back
// (recover_resaves). "" or the error; no exceptions.
std::string commit_dir(const std::string& ckpt_dir, const std::string& tmp, const std::string& final_dir) {
  const std::string aside = final_dir + kResaveSuffix;
  const bool resave = files::exists(final_dir);
  if (resave) {
    files::remove_all(aside);
    if (auto err = files::try_rename(final_dir, aside); !err.empty()) return err;
  }
  if (auto err = files::try_rename(tmp, final_dir); !err.empty()) {
    if (resave) files::try_rename(aside, final_dir);  // the old one stays the checkpoint
    return err;
  }
  if (auto err = files::try_fsync_dir(ckpt_dir); !err.empty()) return err;
  if (resave) files::remove_all(aside);
  return "";
}

// A re-save interrupted between its two renames (commit_dir): the new directory is in place
// (drop the old one) or it is not (the old one goes back).
void recover_resaves(const std::string& ckpt_dir) {
  std::error_code ec;
  const size_t n = std::strlen(kResaveSuffix);
  for (auto& e : stdfs::directory_iterator(ckpt_dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.size() <= n || name.compare(name.size() - n, n, kResaveSuffix) != 0) continue;
    const std::string base = ckpt_dir + "/" + name.substr(0, name.size() - n);
    if (run_dir::parse_step_name(name.substr(0, name.size() - n)) < 0) continue;
    if (files::exists(base)) {
      files::remove_all(e.path().string());
    } else if (files::try_rename(e.path().string(), base).empty()) {
      log::warn("restored checkpoint " + base + " (its re-save was interrupted before the commit)");
      files::fsync_dir(ckpt_dir);
    }
  }
}

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
struct Checkpointer::InFlight {
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

Checkpointer::Checkpointer(const CheckpointConfig& cfg, const std::string& run_dir, int rank, int world, int nodes)
    : cfg_(cfg), ckpt_dir_(run_dir::checkpoints(run_dir)), quarantine_(run_dir::quarantine(run_dir)), rank_(rank),
      world_(world), interval_(cfg, rank == 0, nodes) {
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

Checkpointer::~Checkpointer() { wait(); }

void Checkpointer::wait() {
  if (!inflight_) return;
  const auto t0 = Clock::now();
  inflight_->pacer.hurry();  // someone waits: the rest at full speed, as unpaced
  inflight_->priority.raise(inflight_->thread.native_handle());  // and at normal priority
  inflight_->thread.join();
  close_inflight(ms_since(t0) / 1e3);  // waiting for the writer blocks training too
}

void Checkpointer::wait_snapshot() {
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

void Checkpointer::step_done(double step_s) {
  stall_.step(step_s, inflight_ != nullptr);
  if (inflight_ && inflight_->done.load()) {
    inflight_->thread.join();
    close_inflight(0);
  }
}

// The in-flight save is over (its thread joined): its stall measured, its report recorded.
// extra_s: time the loop waited for it outside any step.
void Checkpointer::close_inflight(double extra_s) {
  SaveReport r = inflight_->report;
  r.steal_ms = 1e3 * inflight_->steal.take_s();
  r.block_ms = r.call_ms + 1e3 * (stall_.take(inflight_->fence_s) + extra_s);
  inflight_.reset();
  record(std::move(r));
}

void Checkpointer::record(SaveReport r) {
  // A failed save leaves no half-written directory taking the space the next attempt needs.
  if (!r.error.empty() && rank_ == 0) files::remove_all(ckpt_dir_ + "/" + step_name(r.step) + ".tmp");
  if (r.error.empty() && rank_ == 0) {
    interval_.record_cost(r.block_ms / 1e3);
    {
      std::lock_guard<std::mutex> lock(mu_);
      verified_.insert(r.step);
    }
    try {  // nothing escapes: a failed retention never fails the save
      prune();
    } catch (const std::exception& e) {
      log::warn(std::string("checkpoint retention: ") + e.what());
    }
  }
  done_.push_back(std::move(r));
}

std::vector<SaveReport> Checkpointer::finished() {
  std::vector<SaveReport> out;
  out.swap(done_);
  return out;
}

void Checkpointer::report(const std::string& other_error, const std::function<void(const SaveReport&)>& saved) {
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

void Checkpointer::prepare(const CheckpointState& st) {
  if (!cfg_.async) return;
  const TensorFiles tfiles = tensor_files(st, rank_);
  if (!tfiles.empty()) staging_.prepare(tfiles, kTensorFileMeta);
}

// This rank's files as write plans. Sync (f null): the tensor files' spans point into the state's
// own memory (kept alive through *keep). Async: they are images in the staging buffer, filled by
// f->copies (staging.h).
std::vector<files::FilePlan> Checkpointer::plan_files(const CheckpointState& st, std::vector<torch::Tensor>* keep,
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

void Checkpointer::save(const CheckpointState& st) {
  quarantine_pending();  // (the trainer moves them once its start is accepted, before any save)
  wait();  // at most one in flight; the wait is counted as the previous save's stall
  const auto t0 = Clock::now();
  const char* kill_env = std::getenv("LM_FAULT_KILL_IN_SAVE");
  const bool kill = kill_env && std::atoll(kill_env) == st.step;
  last_save_step_ = st.step;
  const std::string dir = ckpt_dir_ + "/" + step_name(st.step);
  if (!cfg_.async) {
    clock::StealMeter steal;
    std::vector<torch::Tensor> keep;
    const auto plans = plan_files(st, &keep, nullptr);
    const double mb = plans_mb(plans);
    interval_.set_state_mb(mb);
    std::string err = write_checkpoint(ckpt_dir_, st.step, rank_, world_, plans, cfg_.commit_timeout_s, kill);
    const double ms = ms_since(t0);
    record({st.step, dir, false, ms, ms, ms, mb, 1e3 * steal.take_s(), 0, 0, err});
    if (!err.empty() && cfg_.stop_on_error()) throw Error("checkpoint at step " + std::to_string(st.step) + " failed: " + err);
    return;
  }
  auto f = std::make_unique<InFlight>();
  auto plans = plan_files(st, &f->keep, f.get());
  const double mb = plans_mb(plans);
  interval_.set_state_mb(mb);
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

double Checkpointer::pace_target_s() const {
  const int64_t every = cfg_.every_steps > 0 ? cfg_.every_steps : interval_.interval_steps();
  return std::max(0.0, cfg_.write_pace) * static_cast<double>(every) * mean_step_s_;
}

void Checkpointer::prune() {
  if (cfg_.keep_last <= 0) return;
  auto all = list_checkpoints(ckpt_dir_);
  for (size_t i = static_cast<size_t>(cfg_.keep_last); i < all.size(); ++i) {
    const int64_t step = all[i].first;
    if (cfg_.keep_every > 0 && step % cfg_.keep_every == 0) continue;
    // Deleted only when known to verify (written or loaded by this process, or checked now);
    // one that does not verify is moved aside, never deleted.
    bool known;
    {
      std::lock_guard<std::mutex> lock(mu_);
      known = verified_.count(step) > 0;
    }
    const std::string why = known ? "" : verify(all[i].second);
    if (why.empty()) {
      // Out of sight first (durably), then removed: a crash mid-removal leaves step_N.deleting,
      // never a step_N missing files (which the next start would take for a damaged checkpoint).
      const std::string aside = all[i].second + kDeleteSuffix;
      if (auto err = files::try_rename(all[i].second, aside); !err.empty()) throw Error("cannot remove an old checkpoint: " + err);
      files::fsync_dir(ckpt_dir_);
      files::remove_all(aside);
    } else
      quarantine(all[i].second, why);
  }
}

std::string Checkpointer::quarantine(const std::string& dir, const std::string& why) {
  files::make_dirs(quarantine_);
  const std::string name = stdfs::path(dir).filename().string();
  std::string to = quarantine_ + "/" + name;
  for (int n = 1; files::exists(to); ++n) to = quarantine_ + "/" + name + "." + std::to_string(n);
  if (auto err = files::try_rename(dir, to); !err.empty()) throw Error("cannot move a damaged checkpoint aside: " + err);
  files::fsync_dir(quarantine_);
  files::fsync_dir(ckpt_dir_);
  log::warn("checkpoint " + dir + " did not verify (" + why + "): moved to " + to + " (kept, never deleted)");
  return to;
}

namespace {

// manifest.json's files: name -> {bytes, xxh64}. "" in *why when the manifest is valid and every
// file it lists exists with its size (a cheap check); checksums are left to the reader. A manifest
// of another format version sets *other_version (refused, never skipped).
using ManifestFiles = std::map<std::string, std::pair<uint64_t, std::string>>;
// The manifest's own facts, for load() to compare with state.json's (the manifest has no checksum).
struct ManifestHead {
  int64_t step = -1, world_size = -1;
};
ManifestFiles read_manifest(const std::string& dir, std::string* why, bool* other_version = nullptr,
                            ManifestHead* head = nullptr) {
  ManifestFiles files;
  nlohmann::json m;
  try {
    m = nlohmann::json::parse(files::read_file(dir + "/" + run_dir::kCheckpointManifest));
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
      *why = "checkpoint format version " + m.at("version").dump() + ", this build reads version " +
             std::to_string(kCheckpointVersion) + " (resume it with the build that wrote it, or set "
             "checkpoint.resume=none to start afresh)";
      if (other_version) *other_version = true;
      return files;
    }
    const ManifestHead h{m.at("step").get<int64_t>(), m.at("world_size").get<int64_t>()};
    const int64_t named = run_dir::parse_step_name(stdfs::path(dir).filename().string());
    if (named >= 0 && h.step != named) {
      *why = "manifest.json: step " + std::to_string(h.step) + " in a directory of step " + std::to_string(named);
      return files;
    }
    if (head) *head = h;
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

// Reads files of one checkpoint, each checked against the manifest's checksum in the same pass.
class CheckedReader {
 public:
  CheckedReader(std::string dir, ManifestFiles files) : dir_(std::move(dir)), files_(std::move(files)) {}
  bool has(const std::string& name) const { return files_.count(name) > 0; }
  nlohmann::json json(const std::string& name) const {
    const std::string path = dir_ + "/" + name;
    std::string bytes;
    try {
      bytes = files::read_file(path);
    } catch (const DataError& e) {
      throw CheckpointError(e.what());
    }
    if (hex64(xxh64(bytes.data(), bytes.size())) != entry(name).second) throw CheckpointError(path + ": checksum mismatch");
    try {
      return nlohmann::json::parse(bytes);
    } catch (const std::exception& e) {
      throw CheckpointError(path + ": " + e.what());
    }
  }
  NamedTensors tensors(const std::string& name) const {
    return load_safetensors(dir_ + "/" + name, nullptr, entry(name).second);
  }
  // Throws CheckpointError unless the file is listed and its checksum matches (read, not kept).
  void check(const std::string& name) const {
    if (hex64(xxh64_file(dir_ + "/" + name)) != entry(name).second) throw CheckpointError(dir_ + "/" + name + ": checksum mismatch");
  }

 private:
  const std::pair<uint64_t, std::string>& entry(const std::string& name) const {
    auto it = files_.find(name);
    if (it == files_.end()) throw CheckpointError(dir_ + "/" + name + ": not listed in manifest.json");
    return it->second;
  }
  std::string dir_;
  ManifestFiles files_;
};

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
  if (cfg_.resume_none()) return "";
  if (!cfg_.resume_auto()) {
    try {
      *out = load(cfg_.resume);
    } catch (const CheckpointError& e) {
      throw CheckpointError("checkpoint.resume=" + cfg_.resume + ": " + e.what());
    }
    return cfg_.resume;
  }
  // The newest that verifies; newer ones that do not are moved aside. When checkpoints exist and
  // none verifies, the run stops (a fresh start would silently lose it) unless checkpoint.force.
  std::vector<std::pair<std::string, std::string>> bad;  // directory, why
  for (auto& [step, dir] : list_checkpoints(ckpt_dir_)) {
    std::string why;
    bool other_version = false;
    read_manifest(dir, &why, &other_version);
    if (other_version) throw CheckpointError(dir + ": " + why);
    try {
      *out = load(dir);
    } catch (const CheckpointError& e) {
      std::string what = e.what();  // without the directory, named once in front
      if (what.rfind(dir, 0) == 0) what.erase(0, what.find_first_not_of(":/ ", dir.size()));
      bad.emplace_back(dir, what);
      continue;
    }
    pending_quarantine_ = std::move(bad);
    return dir;
  }
  if (bad.empty()) return "";
  if (!cfg_.force) {
    std::string msg = std::to_string(bad.size()) + " checkpoint(s) and none verifies:";
    for (auto& [d, w] : bad) msg += " " + d + " (" + w + ");";
    throw CheckpointError(msg + " set checkpoint.resume=none to start afresh beside them, or checkpoint.force=true "
                          "to move them to " + quarantine_ + " and start afresh");
  }
  pending_quarantine_ = std::move(bad);
  log::warn("no checkpoint verifies: starting afresh (checkpoint.force)");
  return "";
}

void Checkpointer::quarantine_pending() {
  for (auto& [d, w] : pending_quarantine_) quarantine(d, w);
  pending_quarantine_.clear();
}

CheckpointState Checkpointer::load(const std::string& dir) {
  std::string why;
  ManifestHead head;
  CheckedReader in(dir, read_manifest(dir, &why, nullptr, &head));
  if (!why.empty()) throw CheckpointError(why);
  const auto state = in.json("state.json");
  if (state.value("magic", "") != kCheckpointMagic || state.value("version", 0) != kCheckpointVersion)
    throw CheckpointError(dir + "/state.json: not a version " + std::to_string(kCheckpointVersion) + " checkpoint");
  if (state.value("step", int64_t{-2}) != head.step || state.value("world_size", int64_t{-2}) != head.world_size)
    throw CheckpointError(dir + "/manifest.json: step or world_size differs from state.json's");
  CheckpointState st;
  try {
    st.step = state.at("step").get<int64_t>();
    st.run = state.at("run");
    for (auto& [key, values] : state.at("components").items()) st.replicated[key].values = values;
    for (auto& [key, file] : state.at("tensor_files").items()) st.replicated[key].tensors = in.tensors(file.get<std::string>());
    // A sharded component's parts: checked now (a damaged one makes this checkpoint not verify),
    // read one at a time when the component loads them.
    if (state.contains("part_files"))
      for (auto& [key, files] : state.at("part_files").items()) {
        if (files.size() != static_cast<size_t>(head.world_size))
          throw CheckpointError(dir + "/state.json: " + std::to_string(files.size()) + " parts of '" + key + "' for " +
                                std::to_string(head.world_size) + " ranks");
        for (auto& file : files) {
          const std::string name = file.get<std::string>();
          in.check(name);
          st.replicated[key].shards.push_back([in, name] { return in.tensors(name); });
        }
      }
    // A rank the checkpoint did not have (the world grew) takes rank 0's file: its loader cursor is
    // global; an own-rank component (the RNG streams) gets none (StateRegistry::Scope::kOwnRank).
    const std::string mine = "rank_" + std::to_string(rank_) + ".json";
    const auto rank_state = in.json(in.has(mine) ? mine : "rank_0.json");
    st.saved_rank = rank_state.at("rank").get<int>();
    st.loaded_rank = rank_;
    for (auto& [key, values] : rank_state.at("components").items()) st.per_rank[key].values = values;
  } catch (const nlohmann::json::exception& e) {
    throw CheckpointError(dir + ": malformed state (" + std::string(e.what()) + ")");
  }
  last_save_step_ = st.step;
  if (stdfs::path(dir).lexically_normal() == stdfs::path(ckpt_dir_ + "/" + step_name(st.step)).lexically_normal()) {
    std::lock_guard<std::mutex> lock(mu_);
    verified_.insert(st.step);
  }
  return st;
}

}  // namespace lm
