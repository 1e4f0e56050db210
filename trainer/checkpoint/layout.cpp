// The checkpoint directory's layout: commit, recovery of re-saves, retention and quarantine (see
// layout.h, checkpoint.h).
#include "trainer/checkpoint/layout.h"

#include <cstring>
#include <filesystem>
#include <mutex>

#include "common/errors.h"
#include "common/files.h"
#include "common/log.h"
#include "trainer/checkpoint/checkpoint.h"
#include "run/run_dir.h"

namespace lm {
namespace checkpoint_layout {

namespace stdfs = std::filesystem;

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

}  // namespace checkpoint_layout

using namespace checkpoint_layout;

void Checkpointer::prune() {
  if (cfg_.keep_last <= 0) return;
  auto all = run_dir::list_checkpoints(ckpt_dir_);
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

void Checkpointer::quarantine_pending() {
  for (auto& [d, w] : pending_quarantine_) quarantine(d, w);
  pending_quarantine_.clear();
}

}  // namespace lm
