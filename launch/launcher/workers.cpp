// This node's worker group (see workers.h): the torchrun worker environment, spawning through
// common/process.h, and a poll() loop over the workers' stdout/stderr pipes.
#include "launch/launcher/workers.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <utility>

#include "common/clock.h"
#include "common/errors.h"
#include "common/log.h"

namespace lm::launch {
namespace {

namespace fs = std::filesystem;
using Clock = clock::Steady;

constexpr size_t kMaxLine = 65536;  // a longer partial line goes out unfinished

using clock::seconds_since;

}  // namespace

std::string Failure::encode() const {
  return strf("rank=%d node=%d local_rank=%d pid=%ld code=%d signal=%d", rank, node, local_rank, pid, code, signal);
}

Failure Failure::decode(const std::string& s) {
  Failure f;
  std::sscanf(s.c_str(), "rank=%d node=%d local_rank=%d pid=%ld code=%d signal=%d", &f.rank, &f.node, &f.local_rank,
              &f.pid, &f.code, &f.signal);
  return f;
}

std::string Failure::how() const {
  if (rank < 0) return "lost its launch (connection closed)";
  return signal ? strf("was killed by %s (exit code %d)", signal_name(signal).c_str(), code)
                : strf("exited with code %d", code);
}

void write_all(int fd, const std::string& s) {
  const char* p = s.data();
  size_t n = s.size();
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return;
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
}

WorkerGroup::WorkerGroup(const Options& o, int wake_fd, std::function<void()> on_wake)
    : o_(o), wake_fd_(wake_fd), on_wake_(std::move(on_wake)) {}

WorkerGroup::~WorkerGroup() { close_all(); }

void WorkerGroup::start(int attempt, int offset, int world, int port) {
  fs::path dir = fs::path(o_.log_dir) / o_.run_id / ("attempt_" + std::to_string(attempt));
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw Error(strf("cannot create %s: %s", dir.c_str(), ec.message().c_str()));

  workers_.clear();
  workers_.resize(o_.nproc_per_node);
  first_failure_.reset();
  for (int i = 0; i < o_.nproc_per_node; ++i) {
    Worker& w = workers_[i];
    w.local_rank = i;
    w.rank = offset + i;
    const std::string log_path = (dir / ("rank_" + std::to_string(w.rank) + ".log")).string();
    w.log_fd = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (w.log_fd < 0) throw Error(strf("cannot write %s: %s", log_path.c_str(), std::strerror(errno)));
  }
  for (Worker& w : workers_) {
    spawn(w, attempt, world, port);
    if (int e = w.proc.exec_errno()) {
      stop(SIGKILL, [] { return false; });
      throw UsageError(strf("cannot execute '%s': %s", o_.command_path.c_str(), std::strerror(e)));
    }
  }
}

// torchrun's worker environment on top of this launcher's.
SpawnOptions WorkerGroup::spawn_options(const Worker& w, int attempt, int world, int port) const {
  SpawnOptions so;
  so.argv = o_.command;
  so.program = o_.command_path;
  so.set_env("RANK", std::to_string(w.rank));
  so.set_env("LOCAL_RANK", std::to_string(w.local_rank));
  so.set_env("WORLD_SIZE", std::to_string(world));
  so.set_env("LOCAL_WORLD_SIZE", std::to_string(o_.nproc_per_node));
  so.set_env("GROUP_RANK", std::to_string(o_.node_rank));
  so.set_env("GROUP_WORLD_SIZE", std::to_string(o_.nnodes));
  so.set_env("ROLE_RANK", std::to_string(w.rank));  // one role: role ranks are the global ranks
  so.set_env("ROLE_WORLD_SIZE", std::to_string(world));
  so.set_env("ROLE_NAME", o_.role);
  so.set_env("MASTER_ADDR", o_.master_addr);
  so.set_env("MASTER_PORT", std::to_string(port));
  so.set_env("TORCHELASTIC_RESTART_COUNT", std::to_string(attempt));
  so.set_env("TORCHELASTIC_MAX_RESTARTS", std::to_string(o_.max_restarts));
  so.set_env("TORCHELASTIC_RUN_ID", o_.run_id);
  // The workers' rank 0 hosts the c10d store at MASTER_ADDR:MASTER_PORT (torchrun's c10d
  // rendezvous says the same): no launcher serves it.
  so.set_env("TORCHELASTIC_USE_AGENT_STORE", "False");
  // torchrun 2.x's name (2.2 renamed NCCL_ASYNC_ERROR_HANDLING; the old name warns there); the trainer
  // maps it for LibTorch 1.13.
  if (!std::getenv("TORCH_NCCL_ASYNC_ERROR_HANDLING")) so.set_env("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1");
  if (!std::getenv("OMP_NUM_THREADS") && o_.nproc_per_node > 1) so.set_env("OMP_NUM_THREADS", "1");
  so.in = Redirect::null();
  so.out = Redirect::pipe();
  so.err = Redirect::pipe();
  so.new_group = true;  // signals reach the worker's children too
  so.death_signal = SIGKILL;
  return so;
}

void WorkerGroup::spawn(Worker& w, int attempt, int world, int port) {
  w.proc = Process::spawn(spawn_options(w, attempt, world, port));
  w.running = true;
  w.out = Stream{w.proc.take_stdout(), 1, {}};
  w.err = Stream{w.proc.take_stderr(), 2, {}};
  ::fcntl(w.out.fd, F_SETFL, O_NONBLOCK);
  ::fcntl(w.err.fd, F_SETFL, O_NONBLOCK);
}

void WorkerGroup::pump(int timeout_ms) {
  std::vector<pollfd> fds;
  std::vector<std::pair<Worker*, Stream*>> streams;
  fds.push_back({wake_fd_, POLLIN, 0});
  streams.emplace_back(nullptr, nullptr);
  for (Worker& w : workers_)
    for (Stream* s : {&w.out, &w.err})
      if (s->fd >= 0) {
        fds.push_back({s->fd, POLLIN, 0});
        streams.emplace_back(&w, s);
      }
  int rc = ::poll(fds.data(), fds.size(), timeout_ms);
  if (rc < 0 && errno != EINTR) throw Error(strf("poll: %s", std::strerror(errno)));
  if (rc > 0) {
    if (fds[0].revents) on_wake_();
    for (size_t i = 1; i < fds.size(); ++i)
      if (fds[i].revents) read_stream(*streams[i].first, *streams[i].second);
  }
  reap();
}

void WorkerGroup::reap() {
  for (Worker& w : workers_) {
    if (!w.running) continue;
    std::optional<int> status = w.proc.poll();
    if (!status) continue;
    w.running = false;
    if (*status != 0 && !stopping_ && !first_failure_) {
      Failure f;
      f.rank = w.rank;
      f.node = o_.node_rank;
      f.local_rank = w.local_rank;
      f.pid = w.proc.pid();
      f.code = exit_code(*status);
      f.signal = WIFSIGNALED(*status) ? WTERMSIG(*status) : 0;
      first_failure_ = f;
    }
  }
}

void WorkerGroup::emit_line(Worker& w, Stream& s, const std::string& line) {
  write_all(s.out_fd, "[rank" + std::to_string(w.rank) + "]: " + line + "\n");
  if (w.log_fd >= 0) write_all(w.log_fd, line + "\n");
}

// Reads what is there; complete lines go out, a partial one waits (flushed at EOF or kMaxLine).
void WorkerGroup::read_stream(Worker& w, Stream& s) {
  char buf[kMaxLine];
  while (s.fd >= 0) {
    ssize_t n = ::read(s.fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return;  // EAGAIN: nothing more for now
    if (n == 0) {
      if (!s.buf.empty()) emit_line(w, s, s.buf);
      s.buf.clear();
      ::close(s.fd);
      s.fd = -1;
      return;
    }
    s.buf.append(buf, static_cast<size_t>(n));
    size_t start = 0, nl;
    while ((nl = s.buf.find('\n', start)) != std::string::npos) {
      emit_line(w, s, s.buf.substr(start, nl - start));
      start = nl + 1;
    }
    s.buf.erase(0, start);
    if (s.buf.size() >= kMaxLine) {
      emit_line(w, s, s.buf);
      s.buf.clear();
    }
  }
}

bool WorkerGroup::any_running() const {
  return std::any_of(workers_.begin(), workers_.end(), [](const Worker& w) { return w.running; });
}

void WorkerGroup::stop(int sig, const std::function<bool()>& cut_short) {
  stopping_ = true;
  bool any = false;
  for (Worker& w : workers_)
    if (w.running) {
      w.proc.signal_group(sig);
      any = true;
    }
  if (any) {
    auto t0 = Clock::now();
    while (any_running() && seconds_since(t0) < o_.grace_period_s && !cut_short()) pump(20);
  }
  for (Worker& w : workers_)
    if (w.proc.pid() > 0) w.proc.signal_group(SIGKILL);  // the worker if still alive, and its leftovers
  while (any_running()) pump(20);
  // Output still in the pipes (writers are dead, or leftovers that SIGKILL is taking down).
  auto t0 = Clock::now();
  auto open_streams = [&] {
    return std::any_of(workers_.begin(), workers_.end(), [](const Worker& w) { return w.out.fd >= 0 || w.err.fd >= 0; });
  };
  while (open_streams() && seconds_since(t0) < 1.0) pump(20);
  close_all();
  stopping_ = false;
}

// Flushes partial lines, closes pipes and logs, and forgets the (reaped) processes, so that a
// second stop() signals nobody.
void WorkerGroup::close_all() {
  for (Worker& w : workers_) {
    for (Stream* s : {&w.out, &w.err})
      if (s->fd >= 0) {
        if (!s->buf.empty()) emit_line(w, *s, s->buf);
        ::close(s->fd);
        s->fd = -1;
      }
    if (w.log_fd >= 0) ::close(w.log_fd);
    w.log_fd = -1;
    if (!w.running) w.proc = Process();
  }
}

}  // namespace lm::launch
