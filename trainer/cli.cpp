// The trainer's command line (see cli.h).
#include "trainer/cli.h"

#include <sys/stat.h>

#include <cstdio>
#include <string>
#include <vector>

#include "common/errors.h"
#include "run/config/config.h"
#include "trainer/train.h"

namespace lm {
namespace {

const char* kUsage =
    "usage: trainer CONFIG.yaml [dotted.key=value ...]\n"
    "       trainer --keys\n"
    "  Trains the experiment described by CONFIG.yaml; overrides beat the file.\n"
    "  --keys  prints every config key: its default, allowed values and description.\n";

bool is_file(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

}  // namespace

int trainer_cli(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (!args.empty() && (args[0] == "-h" || args[0] == "--help")) {
    std::fputs(kUsage, stdout);
    return kExitOk;
  }
  if (args.size() == 1 && args[0] == "--keys") {
    std::fputs(describe_keys().c_str(), stdout);
    return kExitOk;
  }
  if (args.empty()) throw UsageError("missing CONFIG.yaml (usage: trainer CONFIG.yaml [dotted.key=value ...])");
  // A run directory may have '=' in its name (a sweep names runs after the swept values): an
  // existing file is the config, whatever its name.
  if (!is_file(args[0]) && (args[0].find('=') != std::string::npos || (!args[0].empty() && args[0][0] == '-')))
    throw UsageError("the first argument must be the config file, got '" + args[0] + "'");
  std::vector<std::string> overrides;
  for (size_t i = 1; i < args.size(); ++i) {
    if (args[i].find('=') == std::string::npos)
      throw UsageError("argument '" + args[i] + "' is not a dotted.key=value override");
    overrides.push_back(args[i]);
  }
  auto cfg = load_config(args[0], overrides);
  if (cfg.data.sources.empty())  // e.g. an empty file, or one of comments only
    throw ConfigError(args[0] + ": key 'data.train' is not set: the trainer needs a prep output directory "
                      "(data.train in the file, data.train=DIR on the command line, or data.sources)");
  std::string command;
  for (int i = 0; i < argc; ++i) command += (i ? " " : "") + std::string(argv[i]);
  train(cfg, command);
  return kExitOk;
}

}  // namespace lm
