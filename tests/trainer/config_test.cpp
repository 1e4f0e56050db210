// Config parsing: precedence, strictness and every bad-input message (trainer/config.h).
#include "trainer/config.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "models/registry.h"
#include "tests/testutil.h"
#include "common/errors.h"

namespace lm {
namespace {

using test::TempDir;
namespace stdfs = std::filesystem;
using test::write_text;

// The ConfigError message of load_config(file with `yaml`, overrides); fails if it loads.
std::string config_error(const std::string& yaml, const std::vector<std::string>& overrides = {}) {
  TempDir dir;
  write_text(dir / "c.yaml", yaml);
  try {
    load_config(dir / "c.yaml", overrides);
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.exit_code(), kExitBadInput);
    std::string msg = e.what();
    // Messages name the file by its path; make them comparable.
    auto p = msg.find(dir / "c.yaml");
    if (p != std::string::npos) msg.replace(p, (dir / "c.yaml").size(), "c.yaml");
    return msg;
  }
  ADD_FAILURE() << "config loaded without error";
  return "";
}

TEST(Config, DefaultsWhenNoFile) {
  auto c = load_config("", {});
  EXPECT_EQ(c.model.arch, "gpt");
  EXPECT_EQ(c.train.grad_accum, 1);
  EXPECT_DOUBLE_EQ(c.optim.lr, 3e-4);
}

TEST(Config, OverridesBeatFileBeatsDefaults) {
  TempDir dir;
  write_text(dir / "c.yaml", "optim:\n  lr: 0.001\n  weight_decay: 0.05\nmodel:\n  n_layer: 6\n");
  auto c = load_config(dir / "c.yaml", {"optim.lr=0.002", "run.dir=/tmp/x y"});
  EXPECT_DOUBLE_EQ(c.optim.lr, 0.002);          // override
  EXPECT_DOUBLE_EQ(c.optim.weight_decay, 0.05);  // file
  EXPECT_EQ(c.model.n_layer, 6);                 // file
  EXPECT_EQ(c.model.n_head, 4);                  // default
  EXPECT_EQ(c.run.dir, "/tmp/x y");
}

TEST(Config, ResolvedYamlRoundTrips) {
  auto c = load_config("", {"optim.lr=1.5e-4", "run.dir=a: b", "schedule.kind=linear", "model.dropout=0.1"});
  TempDir dir;
  write_text(dir / "r.yaml", to_yaml(c));
  auto back = load_config(dir / "r.yaml", {});
  EXPECT_EQ(to_yaml(back), to_yaml(c));
  EXPECT_EQ(back.run.dir, "a: b");
  EXPECT_DOUBLE_EQ(back.optim.lr, 1.5e-4);
  for (const auto& key : config_keys())  // every key the architecture reads is written under its section
    if (key.rfind("model.", 0) != 0 || arch_uses_key(c.model.arch, key.substr(6))) {
      EXPECT_NE(to_yaml(c).find("  " + key.substr(key.find('.') + 1) + ": "), std::string::npos) << key;
    }
}

TEST(Config, TableMarksChangedValues) {
  auto table = to_table(load_config("", {"model.n_layer=7"}));
  EXPECT_NE(table.find("model.n_layer"), std::string::npos);
  EXPECT_NE(table.find("* 7"), std::string::npos);
  EXPECT_EQ(table.find("* 4"), std::string::npos);
}

TEST(Config, UnknownKeyNamesClosestAndLine) {
  EXPECT_EQ(config_error("optim:\n  lr: 0.1\n  wieght_decay: 0.1\n"),
            "c.yaml:3: unknown key 'optim.wieght_decay' (did you mean 'optim.weight_decay'?)");
  EXPECT_EQ(config_error("model:\n  n_layers: 2\n"),
            "c.yaml:2: unknown key 'model.n_layers' (did you mean 'model.n_layer'?)");
  EXPECT_EQ(config_error("trian:\n  max_steps: 2\n"),
            "c.yaml:1: unknown key 'trian' (did you mean 'train'?)");
}

TEST(Config, WrongTypeNamesKeyAndLine) {
  EXPECT_EQ(config_error("run:\n  seed: 1\noptim:\n  lr: fast\n"),
            "c.yaml:4: key 'optim.lr': expected a number, got 'fast'");
  EXPECT_EQ(config_error("train:\n  max_steps: 1.5\n"),
            "c.yaml:2: key 'train.max_steps': expected an integer, got '1.5'");
  EXPECT_EQ(config_error("train:\n  max_steps: [1, 2]\n"),
            "c.yaml:2: key 'train.max_steps': expected a single value, got a list");
  EXPECT_EQ(config_error("model: 5\n"),
            "c.yaml:1: key 'model' is a section; expected a map of keys under it");
  EXPECT_EQ(config_error("train:\n  max_steps:\n"),
            "c.yaml:2: key 'train.max_steps': missing value");
}

TEST(Config, OutOfRangeNamesKeyAndLine) {
  EXPECT_EQ(config_error("model:\n  dropout: 1.5\n"),
            "c.yaml:2: key 'model.dropout': must be in [0, 1), got 1.5");
  EXPECT_EQ(config_error("train:\n  micro_batch_size: 0\n"),
            "c.yaml:2: key 'train.micro_batch_size': must be >= 1, got 0");
  EXPECT_EQ(config_error("schedule:\n  kind: step\n"),
            "c.yaml:2: key 'schedule.kind': must be one of cosine|linear|constant, got 'step'");
  EXPECT_EQ(config_error("model:\n  d_model: 100\n  n_head: 3\n"),
            "key 'model.d_model': 100 is not divisible by model.n_head=3");
}

TEST(Config, YamlSyntaxErrorNamesLine) {
  std::string msg = config_error("run:\n  seed: 1\noptim:\n  lr: [0.1\n  beta1: 0.9\n");
  EXPECT_EQ(msg.rfind("c.yaml:", 0), 0u) << msg;
  EXPECT_NE(msg.find("YAML syntax error"), std::string::npos) << msg;
  EXPECT_EQ(config_error("a: b: c\n").rfind("c.yaml:1: YAML syntax error", 0), 0u);
}

TEST(Config, BadOverridesNameTheOverride) {
  EXPECT_EQ(config_error("", {"optim.lrr=0.1"}),
            "override 'optim.lrr=0.1': unknown key 'optim.lrr' (did you mean 'optim.lr'?)");
  EXPECT_EQ(config_error("", {"optim.lr=abc"}), "override 'optim.lr=abc': key 'optim.lr': expected a number, got 'abc'");
  EXPECT_EQ(config_error("", {"optim.lr"}), "override 'optim.lr': expected dotted.key=value");
  EXPECT_EQ(config_error("", {"model.n_layer="}), "override 'model.n_layer=': key 'model.n_layer': missing value");
}

TEST(Config, MissingFile) {
  try {
    load_config("/nonexistent/x.yaml", {});
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_EQ(std::string(e.what()), "/nonexistent/x.yaml: cannot open config file");
  }
}

TEST(Config, ShippedConfigsLoad) {
  for (auto name : {"configs/tiny.yaml", "configs/kjv.yaml", "configs/gpt2-124m.yaml"})
    EXPECT_NO_THROW(load_config(test::source_path(name), {})) << name;
}

// Hostile config files, as a new user would give them: duplicate keys, lists as keys, invalid
// UTF-8, a directory as the config. Each is one line naming the file and line.
// The ConfigError message of load_config(path), or "" (a test failure) when it is accepted.
std::string file_config_error(const std::string& path, const std::vector<std::string>& overrides = {}) {
  try {
    load_config(path, overrides);
  } catch (const ConfigError& e) {
    EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << "one line: " << e.what();
    return e.what();
  }
  ADD_FAILURE() << path << " was accepted";
  return "";
}

TEST(HostileConfig, DuplicateKeysAreRefusedNamingKeyAndLines) {
  TempDir tmp;
  test::write_text(tmp / "dup.yaml", "optim:\n  lr: 1.0e-3\n  beta1: 0.9\n  lr: 3.0e-3\n");
  EXPECT_EQ(file_config_error(tmp / "dup.yaml"), tmp / "dup.yaml" + ":4: duplicate key 'optim.lr' (first set on line 2)");
  test::write_text(tmp / "dup2.yaml", "model:\n  n_layer: 2\nmodel:\n  n_head: 2\n");
  EXPECT_NE(file_config_error(tmp / "dup2.yaml").find(":3: duplicate key 'model'"), std::string::npos);
}

TEST(HostileConfig, ListsAsKeysDirectoriesAndInvalidUtf8AreOneLine) {
  TempDir tmp;
  test::write_text(tmp / "list.yaml", "optim:\n  [a, b]: 1\n");
  EXPECT_NE(file_config_error(tmp / "list.yaml").find("list.yaml:2: a key must be a plain name, not a list"), std::string::npos);
  test::write_text(tmp / "mapkey.yaml", "? {a: 1}\n: 2\n");
  EXPECT_NE(file_config_error(tmp / "mapkey.yaml").find("a key must be a plain name, not a map"), std::string::npos);
  stdfs::create_directories(tmp / "cfgdir");
  EXPECT_EQ(file_config_error(tmp / "cfgdir"), tmp / "cfgdir" + ": is a directory, expected a YAML experiment file");
  test::write_text(tmp / "utf8.yaml", "run:\n  dir: runs/ok\ndata:\n  train: \"caf\xC3\x28\"\n");
  EXPECT_NE(file_config_error(tmp / "utf8.yaml").find("utf8.yaml:4: not valid UTF-8 (byte "), std::string::npos);
  EXPECT_NE(file_config_error("", {std::string("run.dir=r\xFF")}).find("not valid UTF-8"), std::string::npos);
  // Valid multi-byte UTF-8 stays accepted.
  test::write_text(tmp / "ok.yaml", "run:\n  dir: \"runs/caf\xC3\xA9-\xE2\x82\xAC-\xF0\x9F\x98\x80\"\n");
  EXPECT_EQ(load_config(tmp / "ok.yaml", {}).run.dir, "runs/caf\xC3\xA9-\xE2\x82\xAC-\xF0\x9F\x98\x80");
}

}  // namespace
}  // namespace lm
