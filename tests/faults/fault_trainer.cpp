// build/bin/fault_trainer [--fault KIND@N] [--fault-rank R] [--journal FILE] [--counts FILE] -- CONFIG.yaml [k=v ...]
//
// The trainer (trainer_cli, the same code as build/bin/trainer) with the fault matrix's file system
// installed (tests/faults/fault_fs.h). A test binary: the production trainer has no fault hooks.
// --fault-rank R: under build/bin/launch, only the process with RANK=R gets the fault (the others run
// without one).
// --counts FILE: at a normal exit, the calls made of each kind (for drawing N in a later run); a
// "%RANK%" in FILE becomes the process's RANK (each rank of a launch writes its own).
// --journal FILE: the file system's journal (fault_fs.h), opened by a "start" line naming this
// process (its rank, run id and restart count under build/bin/launch; "-" when run alone).
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "common/errors.h"
#include "tests/faults/fault_fs.h"
#include "trainer/cli.h"

int main(int argc, char** argv) {
  return lm::run_main("fault_trainer", [&] {
    lm::faults::FaultSpec spec;
    std::string journal, counts, fault_rank;
    int i = 1;
    for (; i < argc && std::strcmp(argv[i], "--") != 0; ++i) {
      const std::string a = argv[i];
      if (i + 1 >= argc) throw lm::UsageError(a + ": missing value");
      if (a == "--fault") spec = lm::faults::FaultSpec::parse(argv[++i]);
      else if (a == "--fault-rank") fault_rank = argv[++i];
      else if (a == "--journal") journal = argv[++i];
      else if (a == "--counts") counts = argv[++i];
      else throw lm::UsageError("unknown option " + a + " (usage: fault_trainer [--fault KIND@N] [--fault-rank R] [--journal FILE] [--counts FILE] -- CONFIG.yaml ...)");
    }
    if (i >= argc) throw lm::UsageError("missing '--' before the trainer's arguments");
    auto env = [](const char* name) {
      const char* v = std::getenv(name);
      return std::string(v && *v ? v : "-");
    };
    if (!fault_rank.empty() && env("RANK") != fault_rank) spec = {};  // another rank's fault
    if (const auto at = counts.find("%RANK%"); at != std::string::npos) counts.replace(at, 6, env("RANK"));
    static lm::faults::FaultFileSystem fs(spec, journal);
    lm::files::set_file_system(&fs);
    fs.journal("start pid=" + std::to_string(::getpid()) + " rank=" + env("RANK") + " run_id=" +
               env("TORCHELASTIC_RUN_ID") + " restart=" + env("TORCHELASTIC_RESTART_COUNT"));
    std::vector<char*> targs = {argv[0]};
    for (++i; i < argc; ++i) targs.push_back(argv[i]);
    const int rc = lm::trainer_cli(static_cast<int>(targs.size()), targs.data());
    if (!counts.empty()) {
      FILE* f = std::fopen(counts.c_str(), "w");
      if (f) std::fprintf(f, "%s\n", fs.counts().c_str()), std::fclose(f);
    }
    return rc;
  });
}
