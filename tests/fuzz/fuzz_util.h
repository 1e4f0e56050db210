// Shared by the libFuzzer targets of tests/fuzz (see README.md there): a scratch directory per
// process for parsers that read files, and the contract every parser of outside input must keep:
// bad bytes throw one of the typed bad-input errors (exit 2), never anything else, never a crash.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <typeinfo>

#include "common/errors.h"
#include "common/files.h"

namespace lm::fuzz {

// $TMPDIR/lm_fuzz.<pid>/ (or /tmp), created once; removed at exit.
inline const std::string& scratch_dir() {
  // Never destroyed: the atexit cleanup below runs after static destructors would have.
  static const std::string* dir = [] {
    const char* t = std::getenv("TMPDIR");
    auto* d = new std::string(std::string(t && *t ? t : "/tmp") + "/lm_fuzz." + std::to_string(::getpid()));
    files::make_dirs(*d);
    std::atexit([] { files::remove_all(scratch_dir()); });
    return d;
  }();
  return *dir;
}

// Writes `bytes` to scratch_dir()/name (plainly: the parser reads what the fuzzer gave).
inline std::string put_file(const std::string& name, const std::string& bytes) {
  const std::string path = scratch_dir() + "/" + name;
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f || std::fwrite(bytes.data(), 1, bytes.size(), f) != bytes.size() || std::fclose(f) != 0) std::abort();
  return path;
}

// Runs `parse`; a typed bad-input error (lm::Error with exit code 2) is the accepted way to refuse.
// Any other exception is a finding: printed, then abort() so libFuzzer keeps the input.
template <class F>
void expect_typed(F&& parse) {
  try {
    parse();
  } catch (const Error& e) {
    if (e.exit_code() == kExitBadInput) return;
    std::fprintf(stderr, "FUZZ FINDING: lm::Error with exit code %d: %s\n", e.exit_code(), e.what());
    std::abort();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "FUZZ FINDING: untyped %s: %s\n", typeid(e).name(), e.what());
    std::abort();
  }
}

// Splits `data` at the first occurrence of `sep`: {before, after} ("" after when absent).
inline std::pair<std::string, std::string> split_at(const std::string& data, const std::string& sep) {
  auto p = data.find(sep);
  if (p == std::string::npos) return {data, ""};
  return {data.substr(0, p), data.substr(p + sep.size())};
}

}  // namespace lm::fuzz
