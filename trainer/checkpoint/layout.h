// The checkpoint directory's layout (internal to trainer/checkpoint/): how a checkpoint is
// committed, how an interrupted re-save is recovered, and the names of the directories a save or a
// removal leaves on the way. Listing is run_dir::list_checkpoints (run/run_dir.h), shared with
// the sweep tool. Retention (Checkpointer::prune) and quarantine are defined in layout.cpp.
#pragma once

#include <string>

namespace lm::checkpoint_layout {

constexpr const char* kResaveSuffix = ".old";  // step_N.old: the checkpoint a re-save replaces
// step_N.deleting: a checkpoint retention is removing (renamed first: a crash mid-removal never
// leaves a half-deleted step_N that looks committed; the next Checkpointer finishes the removal).
constexpr const char* kDeleteSuffix = ".deleting";

// Renames the finished `tmp` to `final_dir` and makes it durable. A re-save of the same step moves
// the old directory aside (step_N.old) and removes it only once the new one is committed: a crash
// in between leaves one of them complete, and the next Checkpointer puts it back
// (recover_resaves). "" or the error; no exceptions.
std::string commit_dir(const std::string& ckpt_dir, const std::string& tmp, const std::string& final_dir);

// A re-save interrupted between its two renames (commit_dir): the new directory is in place
// (drop the old one) or it is not (the old one goes back).
void recover_resaves(const std::string& ckpt_dir);

}  // namespace lm::checkpoint_layout
