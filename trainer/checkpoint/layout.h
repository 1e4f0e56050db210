// The checkpoint directory's layout, shared by the writer (writer.h) and the reader (reader.h):
// the format's magic and version, how a checkpoint is committed, how an interrupted re-save is
// recovered, and the names of the directories a save or a removal leaves on the way. Listing is
// run_dir::list_checkpoints (run/run_dir.h), shared with the sweep tool.
//
// RUN_DIR/checkpoints/step_<8-digit step>/   (names from run/run_dir.h)
//   <key>.safetensors  tensors of each replicated component (model, optimizer, ema)     rank 0
//   <key>.part_<r>.safetensors  rank r's part of a sharded component (sharded optimizer, ZeRO-3's weights and EMA)  every rank
//   state.json         magic, version, step, run facts, replicated components' values  rank 0
//   rank_<r>.json      that rank's components (loader state, RNG streams)               every rank
//   manifest.json      magic, version, every file with bytes and xxh64                  rank 0, LAST
// What goes into the files is composed by component (trainer/checkpoint/state.h); a sharded
// component's parts are listed in state.json ("part_files").
// Files are written into "step_<N>.tmp", fsync'd; rank 0 waits until every rank has finished its
// files (rank_<r>.done markers on the shared file system, each renamed into place whole), writes manifest.json, renames the
// directory into place and fsyncs the parent (commit_dir). A directory without a verifying manifest
// is never a checkpoint.
#pragma once

#include <string>

namespace lm {

constexpr const char* kCheckpointMagic = "LMTRAIN-CHECKPOINT";
// 2: components under fixed keys (state.h). 1: fixed model/optimizer/ema files (refused).
constexpr int kCheckpointVersion = 2;

namespace checkpoint_layout {

constexpr const char* kResaveSuffix = ".old";  // step_N.old: the checkpoint a re-save replaces
// step_N.deleting: a checkpoint retention is removing (renamed first: a crash mid-removal never
// leaves a half-deleted step_N that looks committed; the next writer finishes the removal).
constexpr const char* kDeleteSuffix = ".deleting";

// Renames the finished `tmp` to `final_dir` and makes it durable. A re-save of the same step moves
// the old directory aside (step_N.old) and removes it only once the new one is committed: a crash
// in between leaves one of them complete, and the next writer puts it back
// (recover_resaves). "" or the error; no exceptions.
std::string commit_dir(const std::string& ckpt_dir, const std::string& tmp, const std::string& final_dir);

// A re-save interrupted between its two renames (commit_dir): the new directory is in place
// (drop the old one) or it is not (the old one goes back).
void recover_resaves(const std::string& ckpt_dir);

}  // namespace checkpoint_layout
}  // namespace lm
