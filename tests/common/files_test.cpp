// common/files: atomic writes and write plans go through the replaceable FileSystem, in the order
// that makes them durable, and a failure at any call leaves the previous file intact.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "common/checksum.h"
#include "common/clock.h"
#include "common/errors.h"
#include "common/files.h"
#include "tests/testutil.h"

namespace lm {
namespace {

// Records every call and fails the one named in `fail_at` with `error`.
class RecordingFs : public files::FileSystem {
 public:
  std::vector<std::string> calls;
  std::string fail_at;
  int error = EIO;
  size_t count(const std::string& name) const { return std::count(calls.begin(), calls.end(), name); }
  int open_for_write(const char* path, int* fd) override { return hit("open", [&] { return FileSystem::open_for_write(path, fd); }); }
  int write(int fd, const void* d, size_t n, size_t* w) override {
    write_ptrs.push_back(d);
    return hit("write", [&] { return FileSystem::write(fd, d, short_writes && n > 1 ? n / 2 + 1 : n, w); });
  }
  std::vector<const void*> write_ptrs;  // the memory each write() was given
  bool short_writes = false;  // each write takes a little over half of what it is given
  int set_direct(int fd, bool on) override { return hit("set_direct", [&] { return FileSystem::set_direct(fd, on); }); }
  int truncate(int fd, uint64_t n) override { return hit("truncate", [&] { return FileSystem::truncate(fd, n); }); }
  int sync(int fd) override { return hit("sync", [&] { return FileSystem::sync(fd); }); }
  int close(int fd) override { return hit("close", [&] { return FileSystem::close(fd); }); }
  int rename(const char* a, const char* b) override { return hit("rename", [&] { return FileSystem::rename(a, b); }); }
  int sync_dir(const char* d) override { return hit("sync_dir", [&] { return FileSystem::sync_dir(d); }); }
  int remove(const char* p) override { return hit("remove", [&] { return FileSystem::remove(p); }); }

 private:
  template <typename F>
  int hit(const std::string& name, F&& real) {
    calls.push_back(name);
    return name == fail_at ? error : real();
  }
};

struct Installed {
  explicit Installed(files::FileSystem* fs) { files::set_file_system(fs); }
  ~Installed() { files::set_file_system(nullptr); }
};

TEST(Files, AtomicWriteSyncsBeforeRenameAndTheDirectoryAfter) {
  test::TempDir dir;
  RecordingFs fs;
  Installed use(&fs);
  files::write_file_atomic(dir / "a.json", "hello");
  EXPECT_EQ(fs.calls, (std::vector<std::string>{"open", "write", "sync", "close", "rename", "sync_dir"}));
  EXPECT_EQ(test::read_text(dir / "a.json"), "hello");
}

TEST(Files, EveryFailedCallKeepsTheOldFileAndLeavesNoTemp) {
  for (const char* at : {"open", "write", "sync", "close", "rename"}) {
    test::TempDir dir;
    files::write_file_atomic(dir / "a.json", "old");
    RecordingFs fs;
    fs.fail_at = at;
    fs.error = ENOSPC;
    {
      Installed use(&fs);
      try {
        files::write_file_atomic(dir / "a.json", "new");
        ADD_FAILURE() << "no error when " << at << " failed";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("a.json"), std::string::npos) << at << ": " << e.what();
        EXPECT_NE(std::string(e.what()).find(std::strerror(ENOSPC)), std::string::npos) << at << ": " << e.what();
      }
    }
    EXPECT_EQ(test::read_text(dir / "a.json"), "old") << at;
    size_t entries = 0;
    for (auto& e : std::filesystem::directory_iterator(dir.path())) entries += e.path().filename() != "a.json";
    EXPECT_EQ(entries, 0u) << "temp file left behind when " << at << " failed";
  }
}

TEST(Files, FailedDirectorySyncIsAnError) {
  test::TempDir dir;
  RecordingFs fs;
  fs.fail_at = "sync_dir";
  Installed use(&fs);
  EXPECT_THROW(files::fsync_dir(dir.path()), Error);
  EXPECT_NE(files::try_fsync_dir(dir.path()).find("directory fsync failed"), std::string::npos);
}

TEST(Files, WritePlanReportsShortAndFailedWrites) {
  test::TempDir dir;
  const std::string big(3 << 20, 'x');
  files::FilePlan plan{"p.bin", "head", {{big.data(), big.size()}}};
  {
    RecordingFs fs;  // short writes of whatever the real write takes: still complete
    Installed use(&fs);
    files::WrittenFile wf;
    EXPECT_EQ(files::try_write_plan(dir.path(), plan, &wf), "");
    EXPECT_EQ(wf.bytes, 4 + big.size());
    EXPECT_EQ(std::filesystem::file_size(dir / "p.bin"), 4 + big.size());
  }
  RecordingFs fs;
  fs.fail_at = "sync";
  Installed use(&fs);
  const std::string err = files::try_write_plan(dir.path(), plan, nullptr);
  EXPECT_NE(err.find("p.bin"), std::string::npos) << err;
  EXPECT_NE(err.find(std::strerror(EIO)), std::string::npos) << err;
}

// A file of 1 MB or more whose bytes start at a 4096-aligned address (a staged checkpoint image)
// is written with direct I/O from that memory (size not a multiple of the block: padded, then cut;
// an unaligned rest through the bounce buffer), and falls back to buffered writes when direct I/O
// is refused, up front or after an unaligned short write. Other plans are written buffered. The
// bytes and their checksum are the same every way.
TEST(Files, WritePlanDirectIoAndItsFallbacksWriteTheSameBytes) {
  std::string want((3 << 20) + 4099, '\0');
  for (size_t i = 0; i < want.size(); ++i) want[i] = static_cast<char>(i * 31 + i / 7);
  const size_t cap = (want.size() + 4095) / 4096 * 4096;  // aligned_alloc: a multiple of the alignment
  std::unique_ptr<char, decltype(&std::free)> mem(static_cast<char*>(std::aligned_alloc(4096, cap)), &std::free);
  std::memcpy(mem.get(), want.data(), want.size());
  const char* m = mem.get();
  const files::FilePlan image{"p.bin", "", {{m, want.size()}}};
  const files::FilePlan image_in_two{"p.bin", "", {{m, 8192 + 1000}, {m + 8192 + 1000, want.size() - 8192 - 1000}}};
  const files::FilePlan with_head{"p.bin", std::string(m, 4), {{m + 4, want.size() - 4}}};
  struct Case {
    const char* name;
    const files::FilePlan& plan;
    std::string fail_at;
    bool short_writes;
    size_t set_direct_calls, truncates;
    bool from_memory;  // the first write() is given the plan's own memory (not the bounce buffer)
  };
  for (const Case& c : {Case{"direct", image, "", false, 1, 1, true},
                        Case{"direct, an unaligned rest bounced", image_in_two, "", false, 1, 1, true},
                        Case{"direct, then short writes", image, "", true, 2, 0, true},
                        Case{"refused", image, "set_direct", false, 1, 0, true},
                        Case{"a head first: buffered", with_head, "", false, 0, 0, false}}) {
    test::TempDir dir;
    RecordingFs fs;
    fs.fail_at = c.fail_at;
    fs.error = EINVAL;
    fs.short_writes = c.short_writes;
    Installed use(&fs);
    files::WrittenFile wf;
    ASSERT_EQ(files::try_write_plan(dir.path(), c.plan, &wf), "") << c.name;
    EXPECT_EQ(test::read_text(dir / "p.bin"), want) << c.name;
    EXPECT_EQ(wf.bytes, want.size()) << c.name;
    EXPECT_EQ(wf.xxh64, xxh64(want.data(), want.size())) << c.name;
    EXPECT_EQ(fs.count("set_direct"), c.set_direct_calls) << c.name;
    EXPECT_EQ(fs.count("truncate"), c.truncates) << c.name;
    ASSERT_FALSE(fs.write_ptrs.empty()) << c.name;
    EXPECT_EQ(fs.write_ptrs.front() == m, c.from_memory) << c.name;
  }
  RecordingFs fs;  // small files: buffered, no direct I/O asked for
  Installed use(&fs);
  test::TempDir dir;
  ASSERT_EQ(files::try_write_plan(dir.path(), {"s.json", "{}", {}}, nullptr), "");
  EXPECT_EQ(fs.count("set_direct"), 0u);
}

// The tests' own reader (tests/testutil.h): a missing file is an error naming it, never "", so that
// two missing files never compare equal (and a missing metrics.jsonl is never "no records").
TEST(TestUtil, ReadingAMissingFileThrowsNamingIt) {
  test::TempDir dir;
  for (auto read : {+[](const std::string& p) { test::read_text(p); },
                    +[](const std::string& p) { test::metrics_of_kind(p, "train"); }}) {
    try {
      read(dir / "missing.jsonl");
      ADD_FAILURE() << "no error for a missing file";
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find(dir / "missing.jsonl"), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(test::last_train_step(dir / "missing.jsonl"), 0) << "polled before a run writes it";
  test::write_text(dir / "empty", "");
  EXPECT_EQ(test::read_text(dir / "empty"), "");
}

}  // namespace
}  // namespace lm

// The hypervisor's steal (common/clock.h): the 8th number of /proc/stat's "cpu" line, in seconds;
// -1 when the line or the column is missing; the meter's share is a percentage of every CPU's time.
TEST(Clock, HostStealIsTheStealColumnOfProcStat) {
  lm::test::TempDir dir;
  const std::string path = dir / "stat";
  const double hz = static_cast<double>(::sysconf(_SC_CLK_TCK));
  lm::files::write_file_atomic(path, "cpu  10 20 30 40 50 60 70 250 0 0\ncpu0 5 10 15 20 25 30 35 125 0 0\n");
  EXPECT_DOUBLE_EQ(lm::clock::host_steal_s(path), 250 / hz);
  lm::files::write_file_atomic(path, "cpu  10 20 30 40 50 60 70\n");  // a kernel without the column
  EXPECT_EQ(lm::clock::host_steal_s(path), -1);
  lm::files::write_file_atomic(path, "intr 10 20 30 40 50 60 70 250\n");
  EXPECT_EQ(lm::clock::host_steal_s(path), -1);
  EXPECT_EQ(lm::clock::host_steal_s(dir / "missing"), -1);
  ASSERT_GE(lm::clock::host_steal_s(), 0) << "this machine's /proc/stat has a steal column";
  lm::clock::StealMeter meter;
  usleep(20000);
  const double pct = meter.take_pct();
  EXPECT_GE(pct, 0);
  EXPECT_LE(pct, 100);
}
