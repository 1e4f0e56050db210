// The checkpoint directory's layout: commit and recovery of re-saves (see layout.h).
#include "trainer/checkpoint/layout.h"

#include <cstring>
#include <filesystem>

#include "common/files.h"
#include "common/log.h"
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
}  // namespace lm
