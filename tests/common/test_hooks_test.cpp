// The test hooks' registry (common/test_hooks.h): values set and cleared by name, bad values refused
// naming the hook, and every hook listed in docs/testing.md.
#include <gtest/gtest.h>

#include "common/errors.h"
#include "common/test_hooks.h"
#include "tests/testutil.h"

namespace lm {
namespace {

TEST(TestHooks, SetByNameClearedByEmptyBadValuesNamed) {
  EXPECT_TRUE(set_test_hook("LM_FAULT_NAN_STEP", "6"));
  EXPECT_EQ(test_hooks().nan_step, 6);
  EXPECT_TRUE(set_test_hook("LM_FAULT_NAN_STEP", ""));
  EXPECT_EQ(test_hooks().nan_step, 0);
  EXPECT_TRUE(set_test_hook("LM_TEST_MKLDNN", "0"));
  EXPECT_TRUE(test_hooks().mkldnn_off);
  EXPECT_TRUE(set_test_hook("LM_TEST_MKLDNN", ""));
  EXPECT_FALSE(test_hooks().mkldnn_off);
  EXPECT_TRUE(set_test_hook("LM_INVARIANT_COMBINE", "doubling"));
  EXPECT_EQ(test_hooks().invariant_combine, "doubling");
  EXPECT_TRUE(set_test_hook("LM_INVARIANT_COMBINE", ""));
  EXPECT_FALSE(set_test_hook("LM_NO_SUCH_HOOK", "1"));
  for (auto [name, bad] : {std::pair{"LM_FAULT_NAN_STEP", "six"}, std::pair{"LM_ZERO_REDUCE_SCATTER", "yes"},
                           std::pair{"LM_TEST_PEAK_TFLOPS", "-1"}, std::pair{"LM_INVARIANT_COMBINE", "ring"}}) {
    try {
      set_test_hook(name, bad);
      ADD_FAILURE() << name << "=" << bad << " accepted";
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
    }
  }
}

TEST(TestHooks, ListedInTestingMd) {
  const std::string page = test::read_text(test::source_path("docs/testing.md"));
  for (const auto& h : test_hook_list()) {
    EXPECT_NE(page.find(std::string("| `") + h.name + "` |"), std::string::npos) << h.name;
    EXPECT_TRUE(set_test_hook(h.name, "")) << h.name << " is listed but set_test_hook does not know it";
  }
}

}  // namespace
}  // namespace lm
