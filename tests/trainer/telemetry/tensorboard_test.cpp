// TensorBoard event files: scalars written and read back exactly (float precision), the file name
// and the file_version record, every flipped byte caught by a CRC, truncated tails reported (or
// skipped on request), and the bytes cross-checked by an independent Python reader of the TFRecord
// framing and the Event/Summary wire format -- and by the real tensorboard package's
// EventAccumulator when the python3 on PATH has it (the GPU machine's does).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <iostream>
#include <limits>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "tests/testutil.h"
#include "common/errors.h"
#include "common/files.h"
#include "trainer/telemetry/tensorboard.h"

namespace lm {
namespace {

struct Point {
  std::string tag;
  int64_t step;
  double value;
  double wall;
};

// A few curves with awkward values: zero (must still be written: simple_value is in a oneof),
// negatives, tiny, beyond float range (+inf), NaN, large steps, sub-microsecond wall times.
std::vector<Point> sample_points() {
  std::vector<Point> pts;
  const double t0 = 1764500000.123456789;
  const std::vector<double> vals = {0.0, -1.5, 3.14159265358979, 1e-8, 2.5e30, 1e40, -7.25};
  for (int s = 0; s < 7; ++s) {
    pts.push_back({"train/loss", s * 10, vals[s], t0 + s * 0.37});
    pts.push_back({"train/lr", s * 10, 6e-4 * (s + 1) / 7.0, t0 + s * 0.37 + 1e-6});
    if (s % 3 == 0) pts.push_back({"val/loss", s * 10, 2.0 / (s + 1), t0 + s * 0.37 + 0.5});
  }
  pts.push_back({"throughput/tokens_per_s", int64_t{1} << 40, 352431.25, t0 + 99});
  pts.push_back({"train/loss", int64_t{1} << 40, std::numeric_limits<double>::quiet_NaN(), t0 + 100});
  return pts;
}

std::string write_points(const std::string& dir, const std::vector<Point>& pts) {
  TensorBoardWriter w(dir);
  for (const auto& p : pts) w.scalar(p.tag, p.step, p.value, p.wall);
  w.flush();
  return w.path();
}

void expect_same(const std::vector<TensorBoardScalar>& got, const std::vector<Point>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    SCOPED_TRACE("point " + std::to_string(i) + " " + want[i].tag);
    EXPECT_EQ(got[i].tag, want[i].tag);
    EXPECT_EQ(got[i].step, want[i].step);
    EXPECT_EQ(got[i].wall_time, want[i].wall);  // double, exact
    const double f = static_cast<float>(want[i].value);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(got[i].value));
    } else {
      EXPECT_EQ(got[i].value, f);  // float precision, exact
    }
  }
}

std::string host() {
  char buf[256] = {};
  ::gethostname(buf, sizeof buf - 1);
  return buf;
}

std::string base_name(const std::string& p) { return p.substr(p.rfind('/') + 1); }

bool all_digits(const std::string& s) {
  return !s.empty() && s.find_first_not_of("0123456789") == std::string::npos;
}

TEST(TensorBoard, ScalarsReadBackExactly) {
  test::TempDir tmp;
  const auto pts = sample_points();
  const std::string path = write_points(tmp / "run", pts);  // run dir created by the writer
  expect_same(read_tensorboard_scalars(path), pts);
  const auto got = read_tensorboard_scalars(path);
  for (size_t i = 0; i < pts.size(); ++i)
    if (pts[i].value == 1e40) {
      EXPECT_TRUE(std::isinf(got[i].value)) << "1e40 is beyond float range";
    }
}

TEST(TensorBoard, FileNameAndFileVersionRecord) {
  test::TempDir tmp;
  const double before = static_cast<double>(std::time(nullptr));
  TensorBoardWriter w(tmp.path());
  const double after = static_cast<double>(std::time(nullptr)) + 1;
  // events.out.tfevents.<10-digit unix time>.<hostname>.<pid>.<n>
  const std::string name = base_name(w.path());
  const std::string prefix = "events.out.tfevents.";
  ASSERT_EQ(name.rfind(prefix, 0), 0u) << name;
  const std::string ts = name.substr(prefix.size(), 10);
  ASSERT_TRUE(all_digits(ts)) << name;
  EXPECT_GE(std::stod(ts), before - 1);
  EXPECT_LE(std::stod(ts), after);
  const std::string mid = "." + host() + "." + std::to_string(::getpid()) + ".";
  ASSERT_EQ(name.substr(prefix.size() + 10, mid.size()), mid) << name;
  EXPECT_TRUE(all_digits(name.substr(prefix.size() + 10 + mid.size()))) << name;
  EXPECT_EQ(w.path(), tmp.path() + "/" + name);

  // Written and flushed by the constructor: Event{wall_time (field 1, fixed64),
  // file_version (field 3, length-delimited) = "brain.Event:2"}; step 0 is proto3's default and
  // not written. Checked byte by byte, independently of protobuf.
  const auto recs = read_tfrecords(w.path());
  ASSERT_EQ(recs.size(), 1u);
  const std::string& r = recs[0];
  ASSERT_EQ(r.size(), 1 + 8 + 2 + 13u);
  EXPECT_EQ(r[0], '\x09');
  double wall;
  std::memcpy(&wall, r.data() + 1, 8);  // little-endian host
  EXPECT_GE(wall, before - 1);
  EXPECT_LE(wall, after);
  EXPECT_EQ(r.substr(9), std::string("\x1a\x0d") + "brain.Event:2");
  EXPECT_TRUE(read_tensorboard_scalars(w.path()).empty());
}

TEST(TensorBoard, WritersInOneProcessGetDistinctFiles) {
  test::TempDir tmp;
  TensorBoardWriter a(tmp.path()), b(tmp.path());
  EXPECT_NE(a.path(), b.path());
  a.scalar("x", 1, 1.0, 10.0);
  b.scalar("x", 1, 2.0, 10.0);
  a.flush();
  b.flush();
  EXPECT_EQ(read_tensorboard_scalars(a.path()).at(0).value, 1.0);
  EXPECT_EQ(read_tensorboard_scalars(b.path()).at(0).value, 2.0);
}

TEST(TensorBoard, MaskedCrc32cKnownAnswer) {
  // CRC-32C("123456789") = 0xE3069283 (the standard check value), then TFRecord's mask.
  const uint32_t c = 0xE3069283u;
  EXPECT_EQ(masked_crc32c("123456789", 9), ((c >> 15) | (c << 17)) + 0xa282ead8u);
  const uint32_t e = 0;  // CRC-32C of no bytes
  EXPECT_EQ(masked_crc32c("", 0), ((e >> 15) | (e << 17)) + 0xa282ead8u);
}

TEST(TensorBoard, EveryFlippedByteIsCaught) {
  test::TempDir tmp;
  const std::vector<Point> pts = {{"a", 1, 1.0, 5.0}, {"b", 2, 2.0, 6.0}, {"a", 3, 3.0, 7.0}};
  const std::string path = write_points(tmp.path(), pts);
  const std::string good = files::read_file(path);
  ASSERT_GT(good.size(), 60u);
  const std::string bad = tmp / "events.out.tfevents.bad";
  for (size_t i = 0; i < good.size(); ++i) {
    std::string b = good;
    b[i] = static_cast<char>(b[i] ^ 0x20);
    files::write_file_atomic(bad, b);
    try {
      read_tensorboard_scalars(bad);
      ADD_FAILURE() << "flipped byte " << i << " not detected";
    } catch (const DataError& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(bad), std::string::npos) << msg;
      EXPECT_NE(msg.find("record "), std::string::npos) << msg;
      EXPECT_TRUE(msg.find("CRC mismatch") != std::string::npos) << "byte " << i << ": " << msg;
    }
  }
  // The message names the record and its offset: a byte in record 2's data (record 0 is the
  // file_version event, each record here is 12 + payload + 4 bytes).
  const auto recs = read_tfrecords(path);
  ASSERT_EQ(recs.size(), 4u);
  const size_t off2 = (16 + recs[0].size()) + (16 + recs[1].size());
  std::string b = good;
  b[off2 + 12 + 3] ^= 1;
  files::write_file_atomic(bad, b);
  try {
    read_tfrecords(bad);
    ADD_FAILURE() << "not detected";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("record 2 at byte " + std::to_string(off2) + ": data CRC mismatch"),
              std::string::npos)
        << e.what();
  }
}

TEST(TensorBoard, TruncatedLastRecordIsReportedOrSkipped) {
  test::TempDir tmp;
  const std::vector<Point> pts = {{"a", 1, 1.0, 5.0}, {"a", 2, 2.0, 6.0}, {"a", 3, 3.0, 7.0}};
  const std::string path = write_points(tmp.path(), pts);
  const std::string good = files::read_file(path);
  const size_t last = 16 + read_tfrecords(path).back().size();
  const std::string cut_path = tmp / "events.out.tfevents.cut";
  for (size_t cut = 1; cut < last; ++cut) {
    SCOPED_TRACE("cut " + std::to_string(cut));
    files::write_file_atomic(cut_path, good.substr(0, good.size() - cut));
    try {
      read_tensorboard_scalars(cut_path);
      ADD_FAILURE() << "truncation not reported";
    } catch (const DataError& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(cut_path + ": record 3 at byte " + std::to_string(good.size() - last)),
                std::string::npos)
          << msg;
      EXPECT_NE(msg.find("truncated"), std::string::npos) << msg;
    }
    // As TensorBoard does: everything before the partial record.
    expect_same(read_tensorboard_scalars(cut_path, /*skip_truncated_tail=*/true),
                {pts.begin(), pts.end() - 1});
  }
  // Cut exactly at a record boundary: a shorter, valid file.
  files::write_file_atomic(cut_path, good.substr(0, good.size() - last));
  expect_same(read_tensorboard_scalars(cut_path), {pts.begin(), pts.end() - 1});
}

TEST(TensorBoard, RecordThatIsNotAnEventIsRejected) {
  test::TempDir tmp;
  // A well-framed record whose payload is not a valid protobuf message (field number 0).
  const std::string payload("\x00\x01", 2);
  std::string rec;
  for (int i = 0; i < 8; ++i) rec.push_back(static_cast<char>(i == 0 ? payload.size() : 0));
  uint32_t c = masked_crc32c(rec.data(), 8);
  rec.append(reinterpret_cast<const char*>(&c), 4);  // little-endian host
  rec += payload;
  c = masked_crc32c(payload.data(), payload.size());
  rec.append(reinterpret_cast<const char*>(&c), 4);
  const std::string path = tmp / "events.out.tfevents.junk";
  files::write_file_atomic(path, rec);
  EXPECT_EQ(read_tfrecords(path).size(), 1u);  // the framing is fine
  try {
    read_tensorboard_scalars(path);
    ADD_FAILURE() << "not detected";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find(path + ": record 0 is not a TensorBoard Event"), std::string::npos)
        << e.what();
  }
}

TEST(TensorBoard, ErrorsNameTheFile) {
  test::TempDir tmp;
  test::write_text(tmp / "file", "x");
  try {
    TensorBoardWriter w(tmp / "file");  // a regular file where the run dir should be
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(tmp / "file"), std::string::npos) << e.what();
  }
  EXPECT_THROW(read_tensorboard_scalars(tmp / "missing"), DataError);
}

// ---- cross-check with a second, independent implementation ------------------------------------

// Reads an events file with Python's struct and a bitwise CRC-32C table: checks both masked CRCs
// of every record and decodes Event {wall_time=1, step=2, file_version=3, summary=5,
// session_log=7} and Summary.Value {tag=1, simple_value=2} from the protobuf wire format. Prints
// "rec <i> <step> <wall repr> <kind> ...". When the tensorboard package is importable it also
// prints what EventAccumulator (TensorBoard's own reader, which verifies the CRCs too) sees:
// "tb <tag> <step> <value repr> <wall repr>".
const char* kPyReader = R"PY(
import struct, sys

TABLE = []
for i in range(256):
    c = i
    for _ in range(8):
        c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
    TABLE.append(c)

def masked_crc(b):
    c = 0xFFFFFFFF
    for x in b:
        c = TABLE[(c ^ x) & 0xFF] ^ (c >> 8)
    c ^= 0xFFFFFFFF
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF

def varint(b, i):
    v = s = 0
    while True:
        x = b[i]
        i += 1
        v |= (x & 0x7F) << s
        s += 7
        if not x & 0x80:
            return v, i

def fields(b):
    i = 0
    while i < len(b):
        key, i = varint(b, i)
        f, w = key >> 3, key & 7
        if w == 0:
            v, i = varint(b, i)
        elif w == 1:
            v, i = b[i:i + 8], i + 8
        elif w == 2:
            n, i = varint(b, i)
            v, i = b[i:i + n], i + n
        elif w == 5:
            v, i = b[i:i + 4], i + 4
        else:
            raise ValueError("wire type %d" % w)
        yield f, w, v

data = open(sys.argv[1], "rb").read()
off = n = 0
while off < len(data):
    length, lcrc = struct.unpack_from("<QI", data, off)
    assert lcrc == masked_crc(data[off:off + 8]), "length crc of record %d" % n
    payload = data[off + 12:off + 12 + length]
    assert len(payload) == length, "truncated record %d" % n
    (dcrc,) = struct.unpack_from("<I", data, off + 12 + length)
    assert dcrc == masked_crc(payload), "data crc of record %d" % n
    off += 16 + length
    wall, step, out = 0.0, 0, []
    for f, w, v in fields(payload):
        if (f, w) == (1, 1):
            (wall,) = struct.unpack("<d", v)
        elif (f, w) == (2, 0):
            step = v - (1 << 64) if v >= 1 << 63 else v
        elif (f, w) == (3, 2):
            out.append("file_version\t" + v.decode())
        elif (f, w) == (5, 2):
            for vf, vw, val in fields(v):
                assert (vf, vw) == (1, 2), "Summary field %d" % vf
                tag, simple = None, None
                for sf, sw, sv in fields(val):
                    if (sf, sw) == (1, 2):
                        tag = sv.decode()
                    elif (sf, sw) == (2, 5):
                        (simple,) = struct.unpack("<f", sv)
                out.append("scalar\t%s\t%r" % (tag, simple))
        elif (f, w) == (7, 2):
            status = dict((sf, sv) for sf, sw, sv in fields(v)).get(1, 0)
            out.append("session_log\t%d" % status)
        else:
            raise ValueError("unexpected Event field %d" % f)
    for o in out:
        print("rec\t%d\t%d\t%r\t%s" % (n, step, wall, o))
    n += 1

try:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
except ImportError:
    print("tensorboard\tno")
    sys.exit(0)
print("tensorboard\tyes")
acc = EventAccumulator(sys.argv[1], size_guidance={"scalars": 0})
acc.Reload()
for tag in sorted(acc.Tags()["scalars"]):
    for e in acc.Scalars(tag):
        print("tb\t%s\t%d\t%r\t%r" % (tag, e.step, e.value, e.wall_time))
)PY";

std::vector<std::vector<std::string>> tab_lines(const std::string& out, const std::string& first) {
  std::vector<std::vector<std::string>> rows;
  std::istringstream in(out);
  std::string line;
  while (std::getline(in, line)) {
    std::vector<std::string> cols;
    std::istringstream ls(line);
    std::string c;
    while (std::getline(ls, c, '\t')) cols.push_back(c);
    if (!cols.empty() && cols[0] == first) rows.push_back(cols);
  }
  return rows;
}

double num(const std::string& s) { return std::strtod(s.c_str(), nullptr); }  // "nan", "inf" too

// A run that logged steps 0..40, crashed, and resumed from its step-20 checkpoint, written to an
// events file and read by kPyReader (python3 on PATH): its output, the points, the file.
struct ResumedRunRead {
  test::TempDir tmp;
  std::vector<Point> before, after, all;
  std::string path;
  test::RunResult r;
  ResumedRunRead() {
    for (const auto& p : sample_points())
      if (p.step <= 40) before.push_back(p);
    for (int s = 20; s <= 30; s += 10) after.push_back({"train/loss", s, 100.0 + s, 1764600000.5 + s});
    {
      TensorBoardWriter w(tmp.path());
      for (const auto& p : before) w.scalar(p.tag, p.step, p.value, p.wall);
      w.session_start(20, 1764600000.25);
      for (const auto& p : after) w.scalar(p.tag, p.step, p.value, p.wall);
      path = w.path();
    }  // the destructor flushes
    all = before;
    all.insert(all.end(), after.begin(), after.end());
    test::write_text(tmp / "reader.py", kPyReader);
    r = test::run_bin("/usr/bin/env", {"python3", tmp / "reader.py", path});
  }
};

bool have_python3() { return test::run_bin("/usr/bin/env", {"python3", "-c", "pass"}).exit_code == 0; }

TEST(TensorBoard, IndependentPythonReaderAgrees) {
  if (!have_python3()) GTEST_SKIP() << "no python3 on PATH: the independent reader did not run";
  ResumedRunRead run;
  const auto& before = run.before;
  const auto& after = run.after;
  const auto& all = run.all;
  const auto& r = run.r;
  expect_same(read_tensorboard_scalars(run.path), all);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const auto recs = tab_lines(r.out, "rec");
  ASSERT_EQ(recs.size(), 1 + before.size() + 1 + after.size()) << r.out;

  // Record 0: the file_version event.
  EXPECT_EQ(recs[0][1], "0");
  EXPECT_EQ(recs[0][4], "file_version");
  EXPECT_EQ(recs[0][5], "brain.Event:2");
  // Then the scalars, the START session log, the scalars after it.
  size_t k = 1, pi = 0;
  for (; k < recs.size(); ++k) {
    const auto& c = recs[k];
    SCOPED_TRACE("record " + c[1]);
    ASSERT_EQ(num(c[1]), static_cast<double>(k));
    if (k == 1 + before.size()) {
      EXPECT_EQ(c[2], "20");
      EXPECT_EQ(num(c[3]), 1764600000.25);
      EXPECT_EQ(c[4], "session_log");
      EXPECT_EQ(c[5], "1");  // START
      continue;
    }
    const Point& p = all[pi++];
    ASSERT_EQ(c.size(), 7u);
    EXPECT_EQ(c[4], "scalar");
    EXPECT_EQ(c[5], p.tag);
    EXPECT_EQ(std::stoll(c[2]), p.step);
    EXPECT_EQ(num(c[3]), p.wall);
    const double f = static_cast<float>(p.value);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(num(c[6])));
    } else {
      EXPECT_EQ(num(c[6]), f);
    }
  }
  EXPECT_EQ(pi, all.size());
}

// The tensorboard package's own EventAccumulator on the same file: skipped, visibly, where the
// python3 on PATH has no tensorboard package (CI's; the GPU machine's has one).
TEST(TensorBoard, TensorBoardPackageAgrees) {
  if (!have_python3()) GTEST_SKIP() << "no python3 on PATH";
  ResumedRunRead run;
  const auto& r = run.r;
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const auto tb = tab_lines(r.out, "tensorboard");
  ASSERT_EQ(tb.size(), 1u) << r.out;
  if (tb[0][1] != "yes") GTEST_SKIP() << "python3 has no tensorboard package: EventAccumulator not checked";
  // TensorBoard's view: the START event at step 20 drops what it had read at steps >= 20, so each
  // tag shows the points before step 20 and then the resumed run's points.
  std::map<std::string, std::vector<Point>> want;
  for (const auto& p : run.before)
    if (p.step < 20) want[p.tag].push_back(p);
  for (const auto& p : run.after) want[p.tag].push_back(p);
  std::map<std::string, std::vector<std::vector<std::string>>> got;
  for (const auto& c : tab_lines(r.out, "tb")) got[c[1]].push_back(c);
  ASSERT_EQ(got.size(), want.size()) << r.out;
  for (const auto& [tag, pts] : want) {
    SCOPED_TRACE("tensorboard tag " + tag);
    ASSERT_EQ(got[tag].size(), pts.size()) << r.out;
    for (size_t i = 0; i < pts.size(); ++i) {
      EXPECT_EQ(std::stoll(got[tag][i][2]), pts[i].step);
      EXPECT_EQ(num(got[tag][i][4]), pts[i].wall);
      const double f = static_cast<float>(pts[i].value);
      if (std::isnan(f)) {
        EXPECT_TRUE(std::isnan(num(got[tag][i][3])));
      } else {
        EXPECT_EQ(num(got[tag][i][3]), f);
      }
    }
  }
}

}  // namespace
}  // namespace lm
