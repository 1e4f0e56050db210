// Running a sweep's runs (see runner.h).
#include "launch/sweep/runner.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>

#include "common/errors.h"
#include "common/files.h"
#include "common/log.h"
#include "common/process.h"
#include "launch/sweep/summary.h"
#include "run/run_dir.h"

namespace lm::sweep {
namespace {

using Clock = std::chrono::steady_clock;

std::atomic<int> g_signal{0}, g_signal_count{0};
extern "C" void on_signal(int sig) {
  g_signal.store(sig);
  g_signal_count.fetch_add(1);
}

// A run in progress.
struct Running {
  size_t idx;  // into the runs
  Process proc;
  Clock::time_point t0;
};

std::string now_text() {
  std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", std::localtime(&t));
  return buf;
}

void append_line(const std::string& path, const std::string& line) {
  std::ofstream(path, std::ios::app) << line << "\n";
}

std::string sweep_log(const Run& r) { return r.dir + "/sweep.log"; }

// The last non-empty line of a file that is not one of the sweep's own "====" lines.
std::string last_output_line(const std::string& path) {
  std::ifstream in(path);
  std::string last;
  for (std::string line; std::getline(in, line);)
    if (line.find_first_not_of(" \t\r") != std::string::npos && line.rfind("==== sweep", 0) != 0) last = line;
  return last;
}

// Starts argv[0] with stdout+stderr appended to `log`, in its own process group, SIGTERMed if the
// sweep dies; `threads` > 0 sets the thread-count variables the environment does not set.
Process start_child(const std::vector<std::string>& argv, const std::string& log, int threads) {
  SpawnOptions so;
  so.argv = argv;
  if (threads > 0)
    for (const char* var : {"OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"})
      if (!std::getenv(var)) so.set_env(var, std::to_string(threads));
  so.in = Redirect::null();
  so.out = Redirect::file(log, /*append=*/true);
  so.err = Redirect::to_stdout();
  so.new_group = true;
  so.death_signal = SIGTERM;
  Process p = Process::spawn(so);
  if (int e = p.exec_errno())
    append_line(log, "sweep: cannot execute " + argv[0] + ": " + std::strerror(e));
  return p;
}

// A run's outcome from its exit status and its run directory.
void finish_run(Run& r, int status, double secs, size_t idx, size_t total) {
  const std::string log_path = sweep_log(r);
  r.exit_code = exit_code(status);
  r.exit_text = exit_text(status);
  append_line(log_path, strf("==== sweep %s: %s after %.1f s", now_text().c_str(), r.exit_text.c_str(), secs));
  const std::string tag = strf("[%zu/%zu]", idx + 1, total);
  if (r.exit_code == 0 && finished(r)) {
    r.status = "done";
    RunStats st = read_stats(r.dir);
    log::info(strf("%s done  %s in %.1f s: %lld steps, loss %s, best val %s", tag.c_str(), r.name.c_str(), secs,
                   (long long)st.steps, num(st.train_loss, "%.4f").c_str(),
                   std::isfinite(st.best_val) ? num(st.best_val, "%.4f").c_str() : "-"));
  } else if (r.exit_code == 0) {
    r.status = "stopped";
    log::warn(strf("%s stopped %s after %.1f s at step %lld of %lld (resumes on the next sweep)", tag.c_str(),
                   r.name.c_str(), secs, (long long)read_stats(r.dir).steps, (long long)r.cfg.train.max_steps));
  } else if (g_signal_count.load() > 0) {
    r.status = "stopped";
    log::warn(strf("%s stopped %s by %s after %.1f s (resumes on the next sweep)", tag.c_str(), r.name.c_str(),
                   r.exit_text.c_str(), secs));
  } else {
    r.status = "failed";
    log::error(strf("%s FAIL  %s: %s after %.1f s: %s (log: %s)", tag.c_str(), r.name.c_str(), r.exit_text.c_str(),
                    secs, last_output_line(log_path).c_str(), log_path.c_str()));
  }
}

Running start_run(std::vector<Run>& runs, size_t idx) {
  Run& r = runs[idx];
  files::make_dirs(r.dir);
  const std::string log_path = sweep_log(r);
  append_line(log_path, "==== sweep " + now_text() + ": " +
                            (r.state == State::kPartial ? "resume from step " + std::to_string(r.resume_step) : "start") +
                            ": " + join_command(r.argv));
  Process p = start_child(r.argv, log_path, r.threads);
  log::info(strf("[%zu/%zu] start %s (%s, pid %d)", idx + 1, runs.size(), r.name.c_str(),
                 r.state == State::kPartial ? ("resume@" + std::to_string(r.resume_step)).c_str() : "new",
                 static_cast<int>(p.pid())));
  return Running{idx, std::move(p), Clock::now()};
}

// Forwards the signals received since the last call: the first as SIGTERM, later ones as SIGKILL.
// Returns the new count forwarded (at most 2).
int forward_signals(int nsig, std::vector<Running>& running) {
  const int sig = nsig == 1 ? SIGTERM : SIGKILL;
  log::warn(strf("%s: %s to %zu running run(s)%s", signal_name(g_signal.load()).c_str(), signal_name(sig).c_str(),
                 running.size(), sig == SIGTERM ? " (they checkpoint and stop; again to kill them)" : ""));
  for (auto& ru : running) ru.proc.signal(sig);
  return std::min(nsig, 2);
}

void reap_finished(std::vector<Run>& runs, std::vector<Running>& running) {
  for (auto it = running.begin(); it != running.end();) {
    if (std::optional<int> status = it->proc.poll()) {
      const double secs = std::chrono::duration<double>(Clock::now() - it->t0).count();
      finish_run(runs[it->idx], *status, secs, it->idx, runs.size());
      it = running.erase(it);
    } else {
      ++it;
    }
  }
}

}  // namespace

void install_signal_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) ::sigaction(sig, &sa, nullptr);
}

int signals_received() { return g_signal_count.load(); }
int last_signal() { return g_signal.load(); }

int run_all(const SweepSpec& spec, std::vector<Run>& runs, int parallel) {
  std::vector<size_t> queue;
  int done_before = 0;
  for (size_t i = 0; i < runs.size(); ++i) {
    if (runs[i].state == State::kDone) {
      runs[i].status = "done", runs[i].skipped = true, ++done_before;
      log::info(strf("[%zu/%zu] skip  %s (done: %lld steps)", i + 1, runs.size(), runs[i].name.c_str(),
                     (long long)runs[i].cfg.train.max_steps));
    } else {
      queue.push_back(i);
    }
  }
  log::info(strf("sweep %s: %zu runs, %d done, %zu to run, %d at a time%s in %s", spec.path.c_str(), runs.size(),
                 done_before, queue.size(), std::min<int>(parallel, std::max<int>(1, static_cast<int>(queue.size()))),
                 queue.empty() || runs[queue[0]].threads == 0 ? "" : strf(", %d threads each", runs[queue[0]].threads).c_str(),
                 spec.dir.c_str()));

  std::vector<Running> running;
  size_t next = 0;
  int forwarded = 0;  // signals forwarded to the children: 1 = SIGTERM, 2 = SIGKILL
  while (next < queue.size() || !running.empty()) {
    const int nsig = g_signal_count.load();
    if (nsig > forwarded && !running.empty()) forwarded = forward_signals(nsig, running);
    while (nsig == 0 && next < queue.size() && static_cast<int>(running.size()) < parallel)
      running.push_back(start_run(runs, queue[next++]));
    if (nsig > 0 && running.empty()) break;
    reap_finished(runs, running);
    if (!running.empty() || nsig > 0) ::usleep(50 * 1000);
  }
  return done_before;
}

void write_report(const SweepSpec& spec, const std::vector<Run>& runs, const std::string& bin_dir) {
  const std::string tool = bin_dir + "/report";
  if (!files::exists(tool)) {
    log::info("no report tool (" + tool + "): skipping report.html");
    return;
  }
  if (g_signal_count.load() != 0) return;
  std::vector<std::string> a = {tool};
  for (auto& r : runs)
    if (files::exists(run_dir::metrics(r.dir))) a.push_back(r.dir);
  a.insert(a.end(), {"-o", spec.dir + "/report.html"});
  if (a.size() <= 3) return;
  const std::string log_path = spec.dir + "/report.log";
  std::ofstream(log_path, std::ios::trunc) << "==== sweep " << now_text() << ": " << join_command(a) << "\n";
  const int status = start_child(a, log_path, 0).wait();
  if (exit_code(status) == 0)
    log::info("report: " + spec.dir + "/report.html");
  else
    log::warn("report failed (" + exit_text(status) + "): " + last_output_line(log_path) + " (log: " + log_path + ")");
}

}  // namespace lm::sweep
