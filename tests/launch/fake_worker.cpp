// launch_fake_worker: a stand-in for the trainer in launch_tests. Reads RANK and
// TORCHELASTIC_RESTART_COUNT and, per its options, prints its environment, prints numbered lines,
// connects to MASTER_ADDR:MASTER_PORT, sleeps, ignores SIGTERM/SIGINT, or fails with an exit code
// or a signal on a chosen rank and attempt.
//
//   --print-env           "ENV NAME=VALUE" on stdout for every variable
//   --lines N             "line 1" .. "line N" on stdout
//   --connect             "connect ok" / "connect failed" to MASTER_ADDR:MASTER_PORT (TCP)
//   --fail-rank R         fail on rank R (-1: every rank; default none)
//   --fail-attempt A      ... on attempt A only (-1: every attempt, the default)
//   --exit-code C         fail by exiting with C (default 1)
//   --signal S            fail by killing itself with signal number S instead
//   --fail-after S        seconds to wait before failing (default 0)
//   --up-dir D            touch D/up.<attempt>.<rank> once the signal handlers are in place
//   --wait-up N           before failing, wait (at most 60 s) until ranks 0..N-1 of this attempt
//                         are up in --up-dir (so a test's SIGTERM finds their handlers installed)
//   --sleep S             seconds to sleep before exiting 0 (ranks that do not fail)
//   --sleep-attempt A     ... on attempt A only (-1: every attempt, the default)
//   --ignore-term         ignore SIGTERM and SIGINT
//   --ignore-rank R       ... on rank R only (-1: every rank, the default)
// Always prints "worker rank=R local_rank=L attempt=A pid=P" first (stdout) and
// "stderr of rank R" (stderr). On SIGTERM/SIGINT (unless ignored) prints "rank R got SIGNAME" and
// exits 128+signal.
#include <netdb.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>

extern char** environ;

namespace {

int g_rank = 0;

int env_int(const char* name, int def) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoi(v) : def;
}

void on_signal(int sig) {
  char buf[64];
  int n = std::snprintf(buf, sizeof buf, "rank %d got %s\n", g_rank, sig == SIGTERM ? "SIGTERM" : "SIGINT");
  ssize_t ignored = ::write(1, buf, static_cast<size_t>(n));
  (void)ignored;
  ::_exit(128 + sig);
}

void sleep_for(double s) {
  if (s <= 0) return;
  timespec ts{static_cast<time_t>(s), static_cast<long>((s - static_cast<double>(static_cast<time_t>(s))) * 1e9)};
  while (::nanosleep(&ts, &ts) != 0) {
  }
}

bool connect_master() {
  const char* host = std::getenv("MASTER_ADDR");
  const char* port = std::getenv("MASTER_PORT");
  if (!host || !port) return false;
  addrinfo hints{}, *res = nullptr;
  hints.ai_socktype = SOCK_STREAM;
  if (::getaddrinfo(host, port, &hints, &res) != 0) return false;
  bool ok = false;
  for (addrinfo* a = res; a && !ok; a = a->ai_next) {
    int s = ::socket(a->ai_family, a->ai_socktype, a->ai_protocol);
    if (s < 0) continue;
    ok = ::connect(s, a->ai_addr, a->ai_addrlen) == 0;
    ::close(s);
  }
  ::freeaddrinfo(res);
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  bool print_env = false, do_connect = false, ignore_term = false;
  int lines = 0, fail_rank = -2, fail_attempt = -1, exit_code = 1, sig = 0, sleep_attempt = -1, ignore_rank = -1;
  double sleep_s = 0, fail_after_s = 0;
  std::string up_dir;
  int wait_up = 0;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "fake_worker: %s needs a value\n", a.c_str());
        std::exit(64);
      }
      return argv[++i];
    };
    if (a == "--print-env") print_env = true;
    else if (a == "--connect") do_connect = true;
    else if (a == "--ignore-term") ignore_term = true;
    else if (a == "--lines") lines = std::atoi(next());
    else if (a == "--fail-rank") fail_rank = std::atoi(next());
    else if (a == "--fail-attempt") fail_attempt = std::atoi(next());
    else if (a == "--exit-code") exit_code = std::atoi(next());
    else if (a == "--signal") sig = std::atoi(next());
    else if (a == "--sleep") sleep_s = std::atof(next());
    else if (a == "--fail-after") fail_after_s = std::atof(next());
    else if (a == "--sleep-attempt") sleep_attempt = std::atoi(next());
    else if (a == "--ignore-rank") ignore_rank = std::atoi(next());
    else if (a == "--up-dir") up_dir = next();
    else if (a == "--wait-up") wait_up = std::atoi(next());
    else {
      std::fprintf(stderr, "fake_worker: unknown argument %s\n", a.c_str());
      return 64;
    }
  }
  setvbuf(stdout, nullptr, _IOLBF, 0);
  g_rank = env_int("RANK", -1);
  int local_rank = env_int("LOCAL_RANK", -1);
  int attempt = env_int("TORCHELASTIC_RESTART_COUNT", -1);

  if (ignore_term && (ignore_rank == -1 || ignore_rank == g_rank)) {
    ::signal(SIGTERM, SIG_IGN);
    ::signal(SIGINT, SIG_IGN);
  } else {
    ::signal(SIGTERM, on_signal);
    ::signal(SIGINT, on_signal);
  }

  std::printf("worker rank=%d local_rank=%d attempt=%d pid=%d\n", g_rank, local_rank, attempt, (int)::getpid());
  std::fprintf(stderr, "stderr of rank %d\n", g_rank);
  if (print_env)
    for (char** e = environ; *e; ++e) std::printf("ENV %s\n", *e);
  if (do_connect) std::printf("connect %s\n", connect_master() ? "ok" : "failed");
  for (int i = 1; i <= lines; ++i) std::printf("line %d\n", i);
  std::fflush(stdout);
  auto up_file = [&](int rank) { return up_dir + "/up." + std::to_string(attempt) + "." + std::to_string(rank); };
  if (!up_dir.empty()) {
    ::mkdir(up_dir.c_str(), 0755);
    std::fclose(std::fopen(up_file(g_rank).c_str(), "w"));
  }

  bool this_attempt = fail_attempt == -1 || fail_attempt == attempt;
  if (this_attempt && (fail_rank == -1 || fail_rank == g_rank)) {
    for (int r = 0, tries = 0; r < wait_up && tries < 6000; ++tries) {
      if (::access(up_file(r).c_str(), F_OK) == 0) ++r;
      else ::usleep(10000);
    }
    sleep_for(fail_after_s);
    if (sig) {
      ::signal(sig, SIG_DFL);
      ::kill(::getpid(), sig);
      ::pause();
    }
    return exit_code;
  }
  if (sleep_attempt == -1 || sleep_attempt == attempt) sleep_for(sleep_s);
  return 0;
}
