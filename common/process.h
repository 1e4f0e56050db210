// Child processes: the one place that forks and execs. launch starts its workers with it, sweep its
// trainer runs and the report tool, and the tests the real binaries.
//
//   SpawnOptions o;
//   o.argv = {"/path/to/trainer", "configs/tiny.yaml"};
//   o.set_env("OMP_NUM_THREADS", "2");
//   o.out = Redirect::file("run/sweep.log", /*append=*/true);
//   o.err = Redirect::to_stdout();
//   Process p = Process::spawn(o);
//   int status = p.wait();            // exit_code(status), exit_text(status)
//
// Every child gets: the signals a parent may have handled or ignored (SIGINT, SIGTERM, SIGHUP,
// SIGCHLD, SIGPIPE) back at their defaults and no blocked signals; only fds 0-2 (every other
// descriptor of the parent is closed, so logs, sockets and pipes never leak into it). Between fork
// and exec the child makes only async-signal-safe calls, so spawning from a process with threads
// (c10d's, a thread pool's) is safe, and so is spawning from several threads at once (every
// descriptor opened here is close-on-exec).
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace lm {

// Where one of the child's standard streams (stdin, stdout, stderr) goes.
struct Redirect {
  enum class Kind {
    kInherit,   // this process's own stream (the default)
    kNull,      // /dev/null
    kFile,      // `path`: opened for reading (stdin) or writing (created 0644)
    kPipe,      // a pipe; the parent's end is Process::take_stdin/stdout/stderr()
    kToStdout,  // stderr only: the same open file as the child's stdout (2>&1)
  };
  Kind kind = Kind::kInherit;
  std::string path;     // kFile
  bool append = false;  // kFile for stdout/stderr: append (true) or truncate (false)

  static Redirect inherit() { return {}; }
  static Redirect null() { return {Kind::kNull, "", false}; }
  static Redirect file(const std::string& path, bool append) { return {Kind::kFile, path, append}; }
  static Redirect pipe() { return {Kind::kPipe, "", false}; }
  static Redirect to_stdout() { return {Kind::kToStdout, "", false}; }
};

struct SpawnOptions {
  std::vector<std::string> argv;  // REQUIRES: non-empty; the child's argv, argv[0] included
  std::string program;            // the file to execute; default "": argv[0] (no PATH search)
  bool inherit_env = true;        // start from this process's environment; false: an empty one
  // Changes to that environment, applied in order: a value sets NAME, nullopt removes it. The
  // inherited variables keep their order; the set ones follow, in the order they were (last) set.
  std::vector<std::pair<std::string, std::optional<std::string>>> env;
  std::string cwd;                  // working directory; default "": this process's
  Redirect in, out, err;            // default: inherited
  bool new_group = false;           // the child leads a new process group (pgid = its pid), so that
                                    // signal_group() reaches its children and a terminal's ^C does not
  int death_signal = 0;             // sent to the child when this thread exits (PR_SET_PDEATHSIG); 0 none

  SpawnOptions& set_env(const std::string& name, const std::string& value);
  SpawnOptions& unset_env(const std::string& name);
};

// A started child. Owns the parent's ends of its pipes; neither waits for nor signals the child on
// destruction (a child never waited for stays a zombie until this process exits). Move-only.
class Process {
 public:
  // Starts opts.argv. Throws lm::Error (exit 1) naming the file when a redirect file cannot be
  // opened, or when pipe or fork fails. A program that cannot be executed still gives a Process:
  // exec_errno() says why, and the child has exited with 127.
  static Process spawn(const SpawnOptions& opts);

  Process() = default;
  ~Process();
  Process(Process&& other) noexcept;
  Process& operator=(Process&& other) noexcept;
  Process(const Process&) = delete;
  Process& operator=(const Process&) = delete;

  pid_t pid() const { return pid_; }    // -1 when default-constructed
  int exec_errno() const { return exec_errno_; }  // errno of the failed chdir or execve; 0 when it ran

  // The parent's end of a kPipe stream, handed over to the caller (who closes it); -1 when the
  // stream is not a pipe or was taken already.
  int take_stdin() { return take(in_); }
  int take_stdout() { return take(out_); }
  int take_stderr() { return take(err_); }

  // kill(pid, sig). False, sending nothing, once the child was reaped (its pid may be reused).
  bool signal(int sig) const;
  // kill(-pid, sig): the child's process group (REQUIRES: new_group). Also after the child was
  // reaped, for what is left of its group.
  bool signal_group(int sig) const;

  // True while the child has not exited; does not reap it.
  bool running() const;
  // Reaps the child if it exited: its wait status (also on every later call), else nullopt.
  std::optional<int> poll();
  // Blocks until the child exits; its wait status.
  int wait();
  // Waits up to timeout_s: the wait status, or nullopt when it is still running.
  std::optional<int> wait_for(double timeout_s);

 private:
  static int take(int& fd);
  void close_pipes();

  pid_t pid_ = -1;
  int exec_errno_ = 0;
  std::optional<int> status_;  // once reaped
  int in_ = -1, out_ = -1, err_ = -1;
};

// The path of `name` on $PATH (the first executable file), or "" when there is none.
std::string find_on_path(const std::string& name);

// A short command run to its end: argv[0] looked up on $PATH, stdin /dev/null, stdout and stderr
// together into `out_file`, or, when it is empty, returned in *out. Waits up to timeout_s, then
// SIGKILLs it. Returns its exit code (exit_code()); -1 when it is not on $PATH or was killed for
// the timeout. (nvidia-smi for the run's records.)
int run_command(const std::vector<std::string>& argv, const std::string& out_file, std::string* out, double timeout_s);

// "SIGTERM" for a signal number; "signal N" for one without a name here.
std::string signal_name(int sig);
// The exit code a shell would show for a wait status: the code, or 128+signal when killed.
int exit_code(int status);
// A wait status as text: "exit 3", or the signal's name ("SIGKILL") when killed.
std::string exit_text(int status);

}  // namespace lm
