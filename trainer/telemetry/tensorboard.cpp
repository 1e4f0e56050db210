// TensorBoard event files (see tensorboard.h): TFRecord framing with ISA-L's CRC-32C, Events
// serialized by protoc-generated code (trainer/telemetry/tensorboard/{event,summary}.proto).
//
// This translation unit must never include a torch header: it includes protobuf headers, and pip
// LibTorch carries its own protobuf (see the lm_tb notes in CMakeLists.txt).
#include "trainer/telemetry/tensorboard.h"

#include <fcntl.h>
#include <isa-l/crc.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>

#include "common/errors.h"
#include "common/files.h"
#include "trainer/telemetry/tensorboard/event.pb.h"

namespace lm {
namespace {

constexpr const char* kFileVersion = "brain.Event:2";
constexpr size_t kHeaderBytes = 12;  // uint64 length + uint32 masked CRC of it
constexpr size_t kFooterBytes = 4;   // uint32 masked CRC of the data

// Writers opened by this process: the last part of the file name, as in tensorboard's writer.
std::atomic<int> g_writers_opened{0};

std::string errno_text() { return std::strerror(errno); }

// CRC-32C (Castagnoli, as in iSCSI): ISA-L's crc32_iscsi without the conventional pre- and
// post-inversion, so we apply both; chunked because it takes an int length.
uint32_t crc32c(const void* data, size_t n) {
  auto* p = static_cast<unsigned char*>(const_cast<void*>(data));
  uint32_t crc = 0xFFFFFFFFu;
  while (n > 0) {
    const size_t chunk = n < (size_t{1} << 30) ? n : (size_t{1} << 30);
    crc = crc32_iscsi(p, static_cast<int>(chunk), crc);
    p += chunk;
    n -= chunk;
  }
  return ~crc;
}

void put_le(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}

uint64_t get_le(const char* p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= uint64_t(static_cast<unsigned char>(p[i])) << (8 * i);
  return v;
}

std::string hex32(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", v);
  return buf;
}

std::string host_name() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0 || buf[0] == '\0') return "localhost";
  return buf;
}

}  // namespace

uint32_t masked_crc32c(const void* data, size_t n) {
  const uint32_t c = crc32c(data, n);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

// ---- writer ------------------------------------------------------------------------------------

TensorBoardWriter::TensorBoardWriter(const std::string& run_dir) {
  files::make_dirs(run_dir);
  const double now =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  char name[64];
  std::snprintf(name, sizeof name, "events.out.tfevents.%010lld.", static_cast<long long>(now));
  path_ = run_dir + "/" + name + host_name() + "." + std::to_string(::getpid()) + "." +
          std::to_string(g_writers_opened.fetch_add(1));
  // O_EXCL: never append to (or truncate) another writer's file.
  const int fd = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) throw Error(path_ + ": cannot create TensorBoard events file (" + errno_text() + ")");
  f_ = ::fdopen(fd, "wb");
  if (!f_) {
    const std::string err = errno_text();
    ::close(fd);
    throw Error(path_ + ": cannot open TensorBoard events file (" + err + ")");
  }
  tensorboard::Event ev;
  ev.set_wall_time(now);
  ev.set_file_version(kFileVersion);
  try {
    write_record(ev.SerializeAsString());
    flush();
  } catch (...) {
    std::fclose(f_);  // no destructor runs for a throwing constructor
    throw;
  }
}

TensorBoardWriter::~TensorBoardWriter() {
  if (f_) std::fclose(f_);
}

void TensorBoardWriter::write_record(const std::string& data) {
  std::string rec;
  rec.reserve(kHeaderBytes + data.size() + kFooterBytes);
  put_le(rec, data.size(), 8);
  put_le(rec, masked_crc32c(rec.data(), 8), 4);
  rec += data;
  put_le(rec, masked_crc32c(data.data(), data.size()), 4);
  if (std::fwrite(rec.data(), 1, rec.size(), f_) != rec.size())
    throw Error(path_ + ": write failed (" + errno_text() + ")");
}

void TensorBoardWriter::scalar(const std::string& tag, int64_t step, double value, double wall_time_s) {
  tensorboard::Event ev;
  ev.set_wall_time(wall_time_s);
  ev.set_step(step);
  tensorboard::Summary::Value* v = ev.mutable_summary()->add_value();
  v->set_tag(tag);
  v->set_simple_value(static_cast<float>(value));
  write_record(ev.SerializeAsString());
}

void TensorBoardWriter::session_start(int64_t step, double wall_time_s) {
  tensorboard::Event ev;
  ev.set_wall_time(wall_time_s);
  ev.set_step(step);
  ev.mutable_session_log()->set_status(tensorboard::SessionLog::START);
  write_record(ev.SerializeAsString());
}

void TensorBoardWriter::flush() {
  if (std::fflush(f_) != 0) throw Error(path_ + ": flush failed (" + errno_text() + ")");
}

// ---- reader ------------------------------------------------------------------------------------

std::vector<std::string> read_tfrecords(const std::string& path, bool skip_truncated_tail) {
  const std::string bytes = files::read_file(path);
  std::vector<std::string> records;
  size_t off = 0;
  while (off < bytes.size()) {
    const std::string where =
        path + ": record " + std::to_string(records.size()) + " at byte " + std::to_string(off);
    const size_t left = bytes.size() - off;
    const char* p = bytes.data() + off;
    if (left < kHeaderBytes) {
      if (skip_truncated_tail) break;
      throw DataError(where + ": truncated header (" + std::to_string(left) + " of 12 bytes)");
    }
    const uint32_t len_crc = static_cast<uint32_t>(get_le(p + 8, 4));
    if (masked_crc32c(p, 8) != len_crc)
      throw DataError(where + ": length CRC mismatch (stored " + hex32(len_crc) + ", computed " +
                      hex32(masked_crc32c(p, 8)) + ")");
    const uint64_t len = get_le(p, 8);
    if (len > left - kHeaderBytes || left - kHeaderBytes - len < kFooterBytes) {
      if (skip_truncated_tail) break;
      throw DataError(where + ": truncated record (" + std::to_string(len) + " data bytes + 4 CRC bytes " +
                      "declared, " + std::to_string(left - kHeaderBytes) + " left)");
    }
    const char* data = p + kHeaderBytes;
    const uint32_t data_crc = static_cast<uint32_t>(get_le(data + len, 4));
    if (masked_crc32c(data, len) != data_crc)
      throw DataError(where + ": data CRC mismatch (stored " + hex32(data_crc) + ", computed " +
                      hex32(masked_crc32c(data, len)) + ")");
    records.emplace_back(data, len);
    off += kHeaderBytes + len + kFooterBytes;
  }
  return records;
}

std::vector<TensorBoardScalar> read_tensorboard_scalars(const std::string& path, bool skip_truncated_tail) {
  std::vector<TensorBoardScalar> out;
  const std::vector<std::string> records = read_tfrecords(path, skip_truncated_tail);
  for (size_t i = 0; i < records.size(); ++i) {
    tensorboard::Event ev;
    if (!ev.ParseFromString(records[i]))
      throw DataError(path + ": record " + std::to_string(i) + " is not a TensorBoard Event");
    if (!ev.has_summary()) continue;
    for (const auto& v : ev.summary().value()) {
      if (v.value_case() != tensorboard::Summary::Value::kSimpleValue) continue;
      out.push_back({v.tag(), ev.step(), static_cast<double>(v.simple_value()), ev.wall_time()});
    }
  }
  return out;
}

}  // namespace lm
