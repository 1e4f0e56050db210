// common/files: atomic writes and write plans go through the replaceable FileSystem, in the order
// that makes them durable, and a failure at any call leaves the previous file intact.
#include <gtest/gtest.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

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
  int open_for_write(const char* path, int* fd) override { return hit("open", [&] { return FileSystem::open_for_write(path, fd); }); }
  int write(int fd, const void* d, size_t n, size_t* w) override { return hit("write", [&] { return FileSystem::write(fd, d, n, w); }); }
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
    EXPECT_EQ(files::write_plan(dir.path(), plan, &wf), "");
    EXPECT_EQ(wf.bytes, 4 + big.size());
    EXPECT_EQ(std::filesystem::file_size(dir / "p.bin"), 4 + big.size());
  }
  RecordingFs fs;
  fs.fail_at = "sync";
  Installed use(&fs);
  const std::string err = files::write_plan(dir.path(), plan, nullptr);
  EXPECT_NE(err.find("p.bin"), std::string::npos) << err;
  EXPECT_NE(err.find(std::strerror(EIO)), std::string::npos) << err;
}

}  // namespace
}  // namespace lm
