// common/log: a line logged before the log file opens (a data cache warning before the trainer
// knows its run directory) reaches that file too, first, with its own time and level.
#include <gtest/gtest.h>

#include <string>

#include "common/log.h"
#include "tests/testutil.h"

namespace lm {
namespace {

TEST(Log, LinesBeforeTheFileOpensAreWrittenIntoIt) {
  test::TempDir tmp;
  log::warn("data cache: early warning, fetching it again");  // no file yet: stderr (and kept)
  log::info("early info");
  log::init(tmp / "rank_0.log", /*console=*/false);
  log::info("after the file opened");
  log::flush();
  const std::string text = test::read_text(tmp / "rank_0.log");
  const size_t early = text.find("warning data cache: early warning, fetching it again");
  const size_t info = text.find("info early info");
  const size_t after = text.find("after the file opened");
  ASSERT_NE(early, std::string::npos) << text;
  ASSERT_NE(info, std::string::npos) << text;
  ASSERT_NE(after, std::string::npos) << text;
  EXPECT_LT(early, info);
  EXPECT_LT(info, after);
  // A second file gets only what follows: the early lines went into the first one.
  log::init(tmp / "second.log", false);
  log::info("second");
  log::flush();
  EXPECT_EQ(test::read_text(tmp / "second.log").find("early"), std::string::npos);
  log::init("", false);
}

}  // namespace
}  // namespace lm
