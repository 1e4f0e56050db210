// Helpers shared by the test suites: temp directories, running real binaries, small corpora.
#pragma once

#include <string>
#include <vector>

namespace lm::test {

// A fresh empty directory under $TMPDIR (or /tmp), removed by the destructor.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

struct RunResult {
  int exit_code = -1;  // exit status, or 128+signal when killed
  std::string out;     // stdout and stderr together
};

// Runs `bin` (a name in build/bin, or a path) with args through /bin/sh; stdin from /dev/null
// unless `stdin_text` is non-empty.
RunResult run_bin(const std::string& bin, const std::vector<std::string>& args,
                  const std::string& stdin_text = "");
std::string bin_path(const std::string& name);
std::string source_path(const std::string& rel);
void write_text(const std::string& path, const std::string& text);
std::string read_text(const std::string& path);
// A small deterministic English-like corpus of `lines` lines (one document per line).
std::string synthetic_corpus(int lines, unsigned seed = 1);

}  // namespace lm::test
