// Test helpers (see testutil.h).
#include "tests/testutil.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <stdexcept>

namespace lm::test {

TempDir::TempDir() {
  const char* base = std::getenv("TMPDIR");
  std::string tmpl = std::string(base && *base ? base : "/tmp") + "/lmtest.XXXXXX";
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  if (!::mkdtemp(buf.data())) std::abort();
  path_ = buf.data();
}

TempDir::~TempDir() {
  if (!std::getenv("LM_KEEP_TMP")) {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
}

std::string bin_path(const std::string& name) {
  return name.find('/') == std::string::npos ? std::string(LM_BIN_DIR) + "/" + name : name;
}

std::string source_path(const std::string& rel) { return std::string(LM_SOURCE_DIR) + "/" + rel; }

static std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += (c == '\'') ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

RunResult run_bin(const std::string& bin, const std::vector<std::string>& args,
                  const std::string& stdin_text) {
  TempDir tmp;
  std::string cmd = shell_quote(bin_path(bin));
  for (auto& a : args) cmd += " " + shell_quote(a);
  if (!stdin_text.empty()) {
    write_text(tmp / "stdin", stdin_text);
    cmd += " < " + shell_quote(tmp / "stdin");
  } else {
    cmd += " < /dev/null";
  }
  cmd += " 2>&1";
  RunResult r;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  int st = ::pclose(p);
  if (WIFEXITED(st)) r.exit_code = WEXITSTATUS(st);
  else if (WIFSIGNALED(st)) r.exit_code = 128 + WTERMSIG(st);
  return r;
}

Proc spawn_bin(const std::string& bin, const std::vector<std::string>& args, const std::string& log,
               const std::vector<std::string>& env) {
  Proc p;
  p.log = log;
  std::vector<std::string> argv_s{bin_path(bin)};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  pid_t pid = ::fork();
  if (pid == 0) {
    int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    int devnull = ::open("/dev/null", O_RDONLY);
    ::dup2(devnull, 0);
    for (auto& e : env) ::putenv(const_cast<char*>(e.c_str()));
    std::vector<char*> argv;
    for (auto& a : argv_s) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  p.pid = pid;
  return p;
}

void kill_proc(const Proc& p, int sig) {
  if (p.pid > 0) ::kill(p.pid, sig);  // never kill(-1, ...): that signals every process
}

int wait_proc(Proc& p, double timeout_s) {
  if (p.pid <= 0) return -1;
  const auto t0 = std::chrono::steady_clock::now();
  int st = 0;
  while (true) {
    pid_t r = ::waitpid(p.pid, &st, WNOHANG);
    if (r == p.pid) break;
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > timeout_s) {
      ::kill(p.pid, SIGKILL);
      ::waitpid(p.pid, &st, 0);
      break;
    }
    ::usleep(5000);
  }
  p.pid = -1;
  if (WIFEXITED(st)) return WEXITSTATUS(st);
  if (WIFSIGNALED(st)) return 128 + WTERMSIG(st);
  return -1;
}

// Running (not a zombie waiting to be reaped), without reaping it.
static bool alive(const Proc& p) {
  std::ifstream stat("/proc/" + std::to_string(p.pid) + "/stat");
  std::string s((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  auto rp = s.rfind(')');
  return rp != std::string::npos && rp + 2 < s.size() && s[rp + 2] != 'Z';
}

bool wait_until(const Proc& p, const std::function<bool()>& done, double timeout_s) {
  if (p.pid <= 0) return false;
  const auto t0 = std::chrono::steady_clock::now();
  while (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < timeout_s) {
    if (done()) return true;
    if (!alive(p)) return false;
    ::usleep(2000);
  }
  return false;
}

int64_t last_train_step(const std::string& metrics_path) {
  int64_t last = 0;
  for (auto& line : metrics_of_kind(metrics_path, "train")) {
    auto p = line.find("\"step\":");
    if (p != std::string::npos) last = std::max<int64_t>(last, std::atoll(line.c_str() + p + 7));
  }
  return last;
}

void write_text(const std::string& path, const std::string& text) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::ofstream(path, std::ios::binary) << text;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof a;
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

std::string make_bytes_dataset(const std::string& dir, int lines) {
  write_text(dir + "/corpus.txt", synthetic_corpus(lines));
  auto r = run_bin("prep", {dir + "/corpus.txt", "--out", dir + "/data", "--tokenizer", "bytes",
                            "--val-fraction", "0.05", "--quiet"});
  if (r.exit_code != 0) throw std::runtime_error("prep failed: " + r.out);
  return dir + "/data";
}

const std::string& shared_bytes_dataset() {
  static TempDir dir;
  static const std::string data = make_bytes_dataset(dir.path());
  return data;
}

std::vector<std::string> metrics_of_kind(const std::string& path, const std::string& kind) {
  std::vector<std::string> out;
  std::ifstream in(path);
  const std::string needle = "\"kind\":\"" + kind + "\"";
  for (std::string line; std::getline(in, line);)
    if (line.find(needle) != std::string::npos) out.push_back(line);
  return out;
}

std::string synthetic_corpus(int lines, unsigned seed) {
  static const char* words[] = {"and", "the", "lord", "said", "unto", "moses", "in", "beginning",
                                "god", "created", "heaven", "earth", "was", "without", "form",
                                "light", "darkness", "waters", "spirit", "upon", "face", "deep",
                                "day", "night", "evening", "morning", "first", "let", "there", "be"};
  std::mt19937 rng(seed);
  std::ostringstream out;
  for (int i = 0; i < lines; ++i) {
    int n = 4 + static_cast<int>(rng() % 16);
    for (int j = 0; j < n; ++j) out << (j ? " " : "") << words[rng() % (sizeof words / sizeof *words)];
    out << ".\n";
  }
  return out.str();
}

}  // namespace lm::test
