// The metrics sinks behind one background thread: metrics.jsonl, TensorBoard scalars, the console
// line per logged step, a progress bar with ETA when stderr is a terminal, and long-window
// aggregates (mean/min/max tokens/s and MFU per log.long_window_s, "hourly" by default).
//
// The training thread only enqueues a JSON record (write()); formatting, file writes and flushes
// happen on the sink's thread, so telemetry costs the step microseconds (caller_ms() measures it).
// Records are written in the order they were enqueued. Thread-safe.
//
// Errors: a write that fails on the sink's thread (disk full, EIO) never escapes it. The file is
// cut back to its last complete record (the failed batch's records are lost), the next batch
// tries again, and the error ("metrics: PATH: write failed (...)") waits for the training thread
// in take_error(), once per spell of failures; the training thread decides: stop or continue.
#pragma once

#include <nlohmann/json.hpp>

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

namespace lm {

class TensorBoardWriter;

// Seconds as "1h02m" or "3m07s" ("?" when negative, NaN or absurd).
std::string duration_text(double s);

class MetricsSink {
 public:
  struct Options {
    std::string run_dir;
    int64_t keep_through_step = -1;  // resume: keep metrics.jsonl records up to this step; -1 = new file
    bool console = true;             // log train/val lines (and the progress bar on a terminal)
    bool tensorboard = true;         // RUN_DIR/events.out.tfevents.*
    int64_t total_steps = 0;         // for the progress bar's ETA
    double long_window_s = 3600;
  };
  explicit MetricsSink(const Options& opt);
  ~MetricsSink();  // writes everything queued, then stops
  MetricsSink(const MetricsSink&) = delete;
  MetricsSink& operator=(const MetricsSink&) = delete;

  // Enqueues one record ({"kind": "train" | "val" | "checkpoint" | "resume" | "anomaly", ...}).
  void write(nlohmann::json rec);
  // Blocks until every record enqueued so far is written and flushed.
  void flush();
  // The first write error since the last call ("" when none), for the training thread.
  std::string take_error();
  // Total time callers spent inside write(), in milliseconds.
  double caller_ms() const;
  // CPU time the sink's thread has used so far (formatting, writes, flushes, TensorBoard), in ms.
  double sink_cpu_ms() const;
  // The long window's running state (survives a resume through the checkpoint).
  nlohmann::json window_state();
  void load_window_state(const nlohmann::json& j);

 private:
  void run();
  void handle(const nlohmann::json& rec);
  // A train record's tokens per source: data/tokens/NAME (window) and data/share/NAME (run, %).
  void mixture_scalars(const nlohmann::json& rec, int64_t step, double wall);
  void write_batch(const std::deque<nlohmann::json>& batch);
  void fail(const std::string& what);
  void reopen();
  void console_line(const nlohmann::json& rec);
  void long_window(const nlohmann::json& rec);

  Options opt_;
  std::FILE* jsonl_ = nullptr;
  std::unique_ptr<TensorBoardWriter> tb_;
  uint64_t jsonl_good_ = 0, tb_good_ = 0;  // sizes after the last complete flush (sink thread)
  bool failing_ = false;                   // the last batch failed (sink thread)
  std::string error_;                      // guarded by mu_
  bool bar_ = false;
  mutable std::mutex mu_;
  std::condition_variable cv_, idle_cv_;
  std::deque<nlohmann::json> queue_;
  bool stop_ = false, busy_ = false;
  double caller_ms_ = 0;
  // Long window (sink thread only, except under mu_ for state I/O).
  double win_elapsed_ = 0, win_last_wall_ = -1;
  int64_t win_n_ = 0, win_mfu_n_ = 0;
  double win_tps_sum_ = 0, win_tps_min_ = 0, win_tps_max_ = 0;
  double win_mfu_sum_ = 0, win_mfu_min_ = 0, win_mfu_max_ = 0;
  std::thread thread_;
};

}  // namespace lm
