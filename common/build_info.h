// The code version baked in at build time (regenerated on every build from git).
#pragma once

namespace lm {

const char* build_git_commit();  // full commit hash, or "unknown" outside a git checkout
bool build_git_dirty();          // tracked files differed from that commit when built

}  // namespace lm
