// Child processes (see process.h): fork + execve with redirections prepared before the fork, and
// an exec-error pipe so that the parent learns when the program could not be started.
#include "common/process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <thread>

#include "common/errors.h"

extern char** environ;

namespace lm {
namespace {

// Descriptors opened for one spawn; closes what is still open when it goes out of scope, so that a
// throw half-way leaks nothing.
struct Fds {
  int src[3] = {-1, -1, -1};     // what the child gets as fd 0, 1, 2 (-1: keep / 2>&1)
  int parent[3] = {-1, -1, -1};  // the parent's ends of pipes
  int exec_err[2] = {-1, -1};    // the child writes its execve errno here
  Fds() = default;
  Fds(const Fds&) = delete;
  Fds& operator=(const Fds&) = delete;
  ~Fds() {
    for (int* fd : {&src[0], &src[1], &src[2], &parent[0], &parent[1], &parent[2], &exec_err[0], &exec_err[1]})
      close_fd(*fd);
  }
  static void close_fd(int& fd) {
    if (fd >= 0) ::close(fd);
    fd = -1;
  }
};

const char* const kStreamNames[3] = {"stdin", "stdout", "stderr"};

std::string waitpid_error(pid_t pid) {
  return "waitpid(" + std::to_string(pid) + "): " + std::strerror(errno);
}

// Opens what the child's fd `i` (0, 1, 2) should be, per `r`.
void open_redirect(int i, const Redirect& r, Fds& fds) {
  const bool input = i == 0;
  switch (r.kind) {
    case Redirect::Kind::kInherit:
      return;
    case Redirect::Kind::kNull:
      fds.src[i] = ::open("/dev/null", (input ? O_RDONLY : O_WRONLY) | O_CLOEXEC);
      if (fds.src[i] < 0) throw Error(std::string("/dev/null: cannot open: ") + std::strerror(errno));
      return;
    case Redirect::Kind::kFile: {
      const int flags = input ? O_RDONLY : O_WRONLY | O_CREAT | (r.append ? O_APPEND : O_TRUNC);
      fds.src[i] = ::open(r.path.c_str(), flags | O_CLOEXEC, 0644);
      if (fds.src[i] < 0)
        throw Error(r.path + ": cannot open for " + (input ? "reading: " : "writing: ") + std::strerror(errno));
      return;
    }
    case Redirect::Kind::kPipe: {
      int p[2];
      if (::pipe2(p, O_CLOEXEC) != 0) throw Error(std::string("pipe2: ") + std::strerror(errno));
      fds.src[i] = input ? p[0] : p[1];
      fds.parent[i] = input ? p[1] : p[0];
      return;
    }
    case Redirect::Kind::kToStdout:
      if (i != 2) throw Error(std::string("spawn: ") + kStreamNames[i] + " cannot be redirected to stdout");
      return;
  }
}

std::vector<std::string> child_env(const SpawnOptions& o) {
  std::vector<std::string> env;
  if (o.inherit_env)
    for (char** e = environ; *e; ++e) env.emplace_back(*e);
  for (const auto& [name, value] : o.env) {
    const std::string prefix = name + "=";
    env.erase(std::remove_if(env.begin(), env.end(), [&](const std::string& kv) { return kv.rfind(prefix, 0) == 0; }),
              env.end());
    if (value) env.push_back(prefix + *value);
  }
  return env;
}

std::vector<char*> c_strings(std::vector<std::string>& v) {
  std::vector<char*> out;
  for (auto& s : v) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

int max_fd() {
  rlimit rl{};
  return ::getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY
             ? static_cast<int>(std::min<rlim_t>(rl.rlim_cur, 1 << 20))
             : 65536;
}

// Everything the child does between fork and exec: async-signal-safe calls only.
[[noreturn]] void exec_child(const SpawnOptions& o, Fds& fds, const char* program, char* const* argv,
                             char* const* envp, pid_t parent, int fd_limit) {
  if (o.new_group) ::setpgid(0, 0);
  if (o.death_signal != 0) {
    ::prctl(PR_SET_PDEATHSIG, o.death_signal);
    if (::getppid() != parent) ::_exit(127);  // the parent died before prctl took effect
  }
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGCHLD, SIGPIPE}) ::sigaction(sig, &dfl, nullptr);
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  // Lift every source above 3 first, so that no dup2() below overwrites one still to be used.
  for (int* fd : {&fds.src[0], &fds.src[1], &fds.src[2], &fds.exec_err[1]})
    if (*fd >= 0 && *fd < 4) *fd = ::fcntl(*fd, F_DUPFD_CLOEXEC, 4);
  for (int i = 0; i < 3; ++i)
    if (fds.src[i] >= 0) ::dup2(fds.src[i], i);
  if (o.err.kind == Redirect::Kind::kToStdout) ::dup2(1, 2);
  ::dup2(fds.exec_err[1], 3);
  ::fcntl(3, F_SETFD, FD_CLOEXEC);
  if (::syscall(SYS_close_range, 4, ~0U, 0) != 0)
    for (int fd = 4; fd < fd_limit; ++fd) ::close(fd);
  if (o.cwd.empty() || ::chdir(o.cwd.c_str()) == 0) ::execve(program, argv, envp);
  const int e = errno;
  ssize_t ignored = ::write(3, &e, sizeof e);
  (void)ignored;
  ::_exit(127);
}

}  // namespace

SpawnOptions& SpawnOptions::set_env(const std::string& name, const std::string& value) {
  env.emplace_back(name, value);
  return *this;
}

SpawnOptions& SpawnOptions::unset_env(const std::string& name) {
  env.emplace_back(name, std::nullopt);
  return *this;
}

Process Process::spawn(const SpawnOptions& o) {
  if (o.argv.empty()) throw Error("spawn: empty argv");
  std::vector<std::string> argv_s = o.argv, env_s = child_env(o);
  std::vector<char*> argv = c_strings(argv_s), envp = c_strings(env_s);
  const std::string program = o.program.empty() ? o.argv[0] : o.program;
  Fds fds;
  const Redirect* redirects[3] = {&o.in, &o.out, &o.err};
  for (int i = 0; i < 3; ++i) open_redirect(i, *redirects[i], fds);
  if (::pipe2(fds.exec_err, O_CLOEXEC) != 0) throw Error(std::string("pipe2: ") + std::strerror(errno));
  const pid_t parent = ::getpid();
  const int fd_limit = max_fd();

  const pid_t pid = ::fork();
  if (pid < 0) throw Error(std::string("fork: ") + std::strerror(errno));
  if (pid == 0) exec_child(o, fds, program.c_str(), argv.data(), envp.data(), parent, fd_limit);

  if (o.new_group) ::setpgid(pid, pid);  // also here, so that signal_group() works before the child ran
  for (int i = 0; i < 3; ++i) Fds::close_fd(fds.src[i]);
  Fds::close_fd(fds.exec_err[1]);
  Process p;
  p.pid_ = pid;
  int e = 0;
  ssize_t n;
  do n = ::read(fds.exec_err[0], &e, sizeof e);
  while (n < 0 && errno == EINTR);  // EOF (0 bytes): execve succeeded and closed the pipe
  if (n == static_cast<ssize_t>(sizeof e)) p.exec_errno_ = e;
  std::swap(p.in_, fds.parent[0]);
  std::swap(p.out_, fds.parent[1]);
  std::swap(p.err_, fds.parent[2]);
  return p;
}

Process::~Process() { close_pipes(); }

Process::Process(Process&& other) noexcept { *this = std::move(other); }

Process& Process::operator=(Process&& other) noexcept {
  if (this != &other) {
    close_pipes();
    pid_ = std::exchange(other.pid_, -1);
    exec_errno_ = std::exchange(other.exec_errno_, 0);
    status_ = std::exchange(other.status_, std::nullopt);
    in_ = std::exchange(other.in_, -1);
    out_ = std::exchange(other.out_, -1);
    err_ = std::exchange(other.err_, -1);
  }
  return *this;
}

int Process::take(int& fd) { return std::exchange(fd, -1); }

void Process::close_pipes() {
  for (int* fd : {&in_, &out_, &err_}) Fds::close_fd(*fd);
}

bool Process::signal(int sig) const { return pid_ > 0 && !status_ && ::kill(pid_, sig) == 0; }

bool Process::signal_group(int sig) const { return pid_ > 0 && ::kill(-pid_, sig) == 0; }

bool Process::running() const {
  if (pid_ <= 0 || status_) return false;
  siginfo_t info{};
  if (::waitid(P_PID, static_cast<id_t>(pid_), &info, WEXITED | WNOHANG | WNOWAIT) != 0) return false;
  return info.si_pid == 0;
}

std::optional<int> Process::poll() {
  if (pid_ <= 0 || status_) return status_;
  int st = 0;
  pid_t r;
  do r = ::waitpid(pid_, &st, WNOHANG);
  while (r < 0 && errno == EINTR);
  if (r < 0) throw Error(waitpid_error(pid_));
  if (r == pid_) status_ = st;
  return status_;
}

int Process::wait() {
  if (pid_ <= 0) throw Error("wait: no process");
  if (status_) return *status_;
  int st = 0;
  pid_t r;
  do r = ::waitpid(pid_, &st, 0);
  while (r < 0 && errno == EINTR);
  if (r < 0) throw Error(waitpid_error(pid_));
  status_ = st;
  return st;
}

std::optional<int> Process::wait_for(double timeout_s) {
  const auto t0 = std::chrono::steady_clock::now();
  while (!poll()) {
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() >= timeout_s) return std::nullopt;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return status_;
}

std::string signal_name(int sig) {
  static const std::map<int, const char*> names = {
      {SIGHUP, "SIGHUP"},   {SIGINT, "SIGINT"},     {SIGQUIT, "SIGQUIT"}, {SIGILL, "SIGILL"},
      {SIGTRAP, "SIGTRAP"}, {SIGABRT, "SIGABRT"},   {SIGBUS, "SIGBUS"},   {SIGFPE, "SIGFPE"},
      {SIGKILL, "SIGKILL"}, {SIGUSR1, "SIGUSR1"},   {SIGSEGV, "SIGSEGV"}, {SIGUSR2, "SIGUSR2"},
      {SIGPIPE, "SIGPIPE"}, {SIGALRM, "SIGALRM"},   {SIGTERM, "SIGTERM"}, {SIGCHLD, "SIGCHLD"},
      {SIGCONT, "SIGCONT"}, {SIGSTOP, "SIGSTOP"},   {SIGTSTP, "SIGTSTP"}, {SIGTTIN, "SIGTTIN"},
      {SIGTTOU, "SIGTTOU"}, {SIGURG, "SIGURG"},     {SIGXCPU, "SIGXCPU"}, {SIGXFSZ, "SIGXFSZ"},
      {SIGVTALRM, "SIGVTALRM"}, {SIGPROF, "SIGPROF"}, {SIGWINCH, "SIGWINCH"}, {SIGIO, "SIGIO"},
      {SIGPWR, "SIGPWR"},   {SIGSYS, "SIGSYS"}};
  auto it = names.find(sig);
  return it != names.end() ? it->second : "signal " + std::to_string(sig);
}

std::string find_on_path(const std::string& name) {
  const char* path = std::getenv("PATH");
  std::string dirs = path ? path : "/usr/bin:/bin";
  for (size_t at = 0; at <= dirs.size();) {
    size_t end = dirs.find(':', at);
    if (end == std::string::npos) end = dirs.size();
    const std::string dir = end > at ? dirs.substr(at, end - at) : ".";
    const std::string file = dir + "/" + name;
    if (::access(file.c_str(), X_OK) == 0) return file;
    at = end + 1;
  }
  return "";
}

int run_command(const std::vector<std::string>& argv, const std::string& out_file, std::string* out, double timeout_s) {
  SpawnOptions o;
  o.argv = argv;
  o.program = find_on_path(argv.at(0));
  if (o.program.empty()) return -1;
  o.in = Redirect::null();
  o.out = out_file.empty() ? Redirect::pipe() : Redirect::file(out_file, false);
  o.err = Redirect::to_stdout();
  Process p = Process::spawn(o);
  if (out_file.empty()) {  // read until EOF: the child's output is small (a pipe's worth at most is not assumed)
    const int fd = p.take_stdout();
    const auto t0 = std::chrono::steady_clock::now();
    char buf[4096];
    for (;;) {
      const double left = timeout_s - std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (left <= 0) break;
      pollfd pf{fd, POLLIN, 0};
      if (::poll(&pf, 1, static_cast<int>(std::min(left, 1.0) * 1000) + 1) <= 0) continue;
      const ssize_t n = ::read(fd, buf, sizeof buf);
      if (n <= 0) break;
      if (out) out->append(buf, static_cast<size_t>(n));
    }
    ::close(fd);
  }
  if (auto status = p.wait_for(timeout_s)) return exit_code(*status);
  p.signal(SIGKILL);
  p.wait();
  return -1;
}

int exit_code(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

std::string exit_text(int status) {
  if (WIFSIGNALED(status)) return signal_name(WTERMSIG(status));
  return "exit " + std::to_string(exit_code(status));
}

}  // namespace lm
