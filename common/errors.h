// Typed errors and the project's exit codes.
//
// Every error a user can fix (bad config, bad data, refused checkpoint, bad command line) is one of
// the BadInput kinds below and exits with code 2 after printing ONE line that names the key, file
// or line. Anything else is a runtime failure and exits with code 1. `main` functions call
// run_main(), which does the catching and printing; nothing else prints errors.
#pragma once

#include <functional>
#include <stdexcept>
#include <string>

namespace lm {

enum ExitCode : int { kExitOk = 0, kExitFailure = 1, kExitBadInput = 2 };

// Base of all project errors. `exit_code()` is what main() returns for it.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what, int exit_code = kExitFailure)
      : std::runtime_error(what), exit_code_(exit_code) {}
  int exit_code() const { return exit_code_; }

 private:
  int exit_code_;
};

// Bad experiment config: unknown key, wrong type, out of range, YAML syntax. Message names the key
// and, for values from a file, "FILE:LINE".
struct ConfigError : Error {
  explicit ConfigError(const std::string& w) : Error(w, kExitBadInput) {}
};
// Bad or missing data: input files, shards, manifests. Message names the file.
struct DataError : Error {
  explicit DataError(const std::string& w) : Error(w, kExitBadInput) {}
};
// A checkpoint that cannot be used (damaged, incompatible). Message names the path and why.
struct CheckpointError : Error {
  explicit CheckpointError(const std::string& w) : Error(w, kExitBadInput) {}
};
// Bad command line.
struct UsageError : Error {
  explicit UsageError(const std::string& w) : Error(w, kExitBadInput) {}
};

// Remote data unreachable for longer than data.remote_timeout_s (a runtime fault, exit 1): the run
// checkpoints and ends; resuming it later continues. Message names the URL.
struct RemoteError : Error {
  explicit RemoteError(const std::string& w) : Error(w, kExitFailure) {}
};

// Runs `body` and turns any exception into one line "PROG: error: MESSAGE" on stderr and the
// matching exit code (2 for the bad-input kinds above, 1 otherwise).
int run_main(const char* prog, const std::function<int()>& body);

}  // namespace lm
