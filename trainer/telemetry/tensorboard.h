// TensorBoard event files: a writer for scalars and a verifying reader (torch-free, lm_tb).
//
// File: RUN_DIR/events.out.tfevents.<unix time, 10 digits>.<hostname>.<pid>.<n>, named like
// TensorFlow's / tensorboard's EventFileWriter (n counts the writers this process opened, from 0).
// Content: a TFRecord stream of serialized tensorboard.Event protos (trainer/telemetry/tensorboard/*.proto,
// a wire-compatible subset of tensorboard/compat/proto/{event,summary}.proto). Each record is
//   uint64 length (LE) | uint32 masked_crc32c(length bytes) | data | uint32 masked_crc32c(data)
// with masked_crc32c(x) = ((c >> 15) | (c << 17)) + 0xa282ead8, c = CRC-32C (Castagnoli) of x.
// Record 0 is Event{wall_time, file_version: "brain.Event:2"}; every scalar is one Event
// {wall_time, step, summary {value {tag, simple_value}}}. The real TensorBoard reads these files.
//
// Not written atomically (unlike STYLE habit 7): TensorBoard tails the file while the run appends
// to it. The per-record CRCs are the checksum; a crash leaves at most a truncated last record,
// which TensorBoard ignores and read_tfrecords() reports (or skips, when asked).
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace lm {

// Appends scalars to a new events file under a run directory.
// Thread-safety: none; one writer is used from one thread (the trainer's metrics thread).
// Errors: lm::Error naming the file when it cannot be created or written.
class TensorBoardWriter {
 public:
  // Creates run_dir (mkdir -p) and a new events file in it, and writes the file_version record.
  explicit TensorBoardWriter(const std::string& run_dir);
  // Flushes and closes; never throws (a failure here is lost, as with any destructor).
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  // One point of the curve `tag` (e.g. "train/loss") at `step`. `value` is stored as a float
  // (TensorBoard's simple_value): rounded to nearest, beyond +-3.4e38 it becomes +-inf; NaN stays
  // NaN. wall_time_s: seconds since the Unix epoch (what TensorBoard's "relative"/"wall" axes use).
  // Buffered: visible to readers after flush().
  void scalar(const std::string& tag, int64_t step, double value, double wall_time_s);
  // Marks a (re)start of the run at `step` (a SessionLog START event). Optional; call it once
  // when a resumed run starts logging: TensorBoard then drops the points at steps >= `step` that it
  // read before, i.e. what the crashed attempt logged past the checkpoint it resumed from.
  void session_start(int64_t step, double wall_time_s);
  // fflush (no fsync): hands buffered records to the OS so TensorBoard sees them.
  void flush();
  const std::string& path() const { return path_; }

 private:
  void write_record(const std::string& data);

  std::string path_;
  std::FILE* f_ = nullptr;
};

// One scalar point read back from an events file.
struct TensorBoardScalar {
  std::string tag;
  int64_t step = 0;
  double value = 0;  // the stored float, widened
  double wall_time = 0;
};

// The payloads of every record of a TFRecord file, in order, after checking both CRCs of each.
// Throws DataError naming the file, the record index and its byte offset on a bad CRC or a
// truncated record. skip_truncated_tail = true instead stops quietly at a truncated LAST record,
// as TensorBoard does (use it to read a file that a live run is still appending to); a bad CRC
// still throws.
std::vector<std::string> read_tfrecords(const std::string& path, bool skip_truncated_tail = false);

// Every simple_value scalar of an events file, in file order (records checked as above; a record
// that is not an Event also throws DataError). Other events (file_version, session_log) are
// skipped.
std::vector<TensorBoardScalar> read_tensorboard_scalars(const std::string& path,
                                                        bool skip_truncated_tail = false);

// The TFRecord framing's masked CRC-32C of n bytes (exposed for tests and tools).
uint32_t masked_crc32c(const void* data, size_t n);

}  // namespace lm
