// Config parsing: precedence, strictness and every bad-input message (run/config/config.h).
#include "run/config/config.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <sstream>

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
            "c.yaml:2: key 'schedule.kind': must be one of cosine|linear|constant|wsd, got 'step'");
  EXPECT_EQ(config_error("model:\n  d_model: 100\n  n_head: 3\n"),
            "key 'model.d_model': 100 is not divisible by model.n_head=3");
}

// schedule.kind wsd and its keys, the anneal stage and optim.z_loss: what loads, what it resolves
// to, and each refusal as its one line naming the key (and where it was set).
// Checked to fail with the anneal stage's start off by one and the "decay placed" check removed.
TEST(Config, WsdScheduleAnnealAndZLoss) {
  auto c = load_config("", {"schedule.kind=wsd", "schedule.decay_fraction=0.2", "schedule.decay_shape=1-sqrt",
                            "optim.z_loss=1e-4"});
  EXPECT_EQ(c.schedule.anneal_start, -1);
  EXPECT_EQ(wsd_decay_window(c.schedule, c.train.max_steps).start, 800);
  EXPECT_DOUBLE_EQ(c.optim.z_loss, 1e-4);
  const std::string two = "data.sources=[{name: a, path: /d/a}, {name: b, path: /d/b}]";
  const std::string anneal = "data.stages=[{until: 600, weights: {a: 1}}, {weights: {a: 1, b: 1}, anneal: true}]";
  c = load_config("", {"data.train=", two, anneal, "schedule.kind=wsd"});
  EXPECT_EQ(c.schedule.anneal_start, 600);
  EXPECT_EQ(wsd_decay_window(c.schedule, c.train.max_steps).end, 1000);
  EXPECT_NE(to_yaml(c).find("anneal: true"), std::string::npos) << to_yaml(c);
  {  // config.yaml round trip: the anneal stage and the wsd keys come back
    TempDir dir;
    write_text(dir / "r.yaml", to_yaml(c));
    EXPECT_EQ(load_config(dir / "r.yaml", {}).schedule.anneal_start, 600);
  }
  c = load_config("", {"data.train=", two, anneal, "schedule.kind=wsd", "schedule.decay_steps=100"});
  EXPECT_EQ(wsd_decay_window(c.schedule, c.train.max_steps).end, 700);  // a length from the anneal stage
  // A cosine config.yaml (every key written, wsd's at their defaults) loads.
  EXPECT_NO_THROW(load_config("", {"schedule.decay_shape=linear", "schedule.decay_fraction=0"}));

  EXPECT_EQ(config_error("schedule:\n  kind: wsd\n"),
            "c.yaml:2: key 'schedule.kind': wsd needs the decay placed: schedule.decay_steps, schedule.decay_fraction "
            "or a data.stages entry with anneal: true");
  EXPECT_EQ(config_error("schedule:\n  kind: wsd\n  decay_steps: 1001\n"),
            "c.yaml:3: key 'schedule.decay_steps': the decay (1001 steps) is longer than train.max_steps=1000");
  EXPECT_EQ(config_error("schedule:\n  kind: wsd\n  decay_steps: 950\n"),
            "c.yaml:3: key 'schedule.decay_steps': the decay (steps 50-1000) would start inside the warmup "
            "(schedule.warmup_steps=100)");
  EXPECT_EQ(config_error("schedule:\n  kind: wsd\n  decay_steps: 100\n  decay_fraction: 0.1\n"),
            "c.yaml:4: key 'schedule.decay_fraction': set either schedule.decay_steps or schedule.decay_fraction, not both");
  EXPECT_EQ(config_error("", {"schedule.kind=wsd", "schedule.decay_fraction=0.0001"}),
            "override 'schedule.decay_fraction=0.0001': key 'schedule.decay_fraction': the decay is 0 steps of "
            "train.max_steps=1000; it needs at least 1");
  EXPECT_EQ(config_error("schedule:\n  decay_shape: 1-sqrt\n"),
            "c.yaml:2: key 'schedule.decay_shape': applies to schedule.kind=wsd only (it is cosine)");
  EXPECT_EQ(config_error("", {"schedule.kind=linear", "schedule.decay_fraction=0.1"}),
            "override 'schedule.decay_fraction=0.1': key 'schedule.decay_fraction': applies to schedule.kind=wsd only "
            "(it is linear)");
  EXPECT_EQ(config_error("", {"schedule.decay_shape=sqrt"}),
            "override 'schedule.decay_shape=sqrt': key 'schedule.decay_shape': must be one of linear|1-sqrt|cosine, got "
            "'sqrt'");
  EXPECT_EQ(config_error("", {"optim.z_loss=-1"}), "override 'optim.z_loss=-1': key 'optim.z_loss': must be in [0, inf), got -1");
  // The anneal stage.
  const std::string where = "override '" + anneal + "': ";
  EXPECT_EQ(config_error("", {"data.train=", two, anneal}),
            where + "key 'data.stages': stage 2: anneal needs schedule.kind=wsd (it is cosine)");
  EXPECT_EQ(config_error("", {"data.train=", two, anneal, "schedule.kind=wsd", "train.max_steps=600"}),
            where + "key 'data.stages': stage 2 starts at step 600, not before train.max_steps=600: the decay would "
            "never start");
  EXPECT_EQ(config_error("", {"data.train=", two, anneal, "schedule.kind=wsd", "schedule.decay_steps=500"}),
            "override 'schedule.decay_steps=500': key 'schedule.decay_steps': the decay from the anneal stage (steps "
            "600-1100) ends after train.max_steps=1000");
  EXPECT_EQ(config_error("", {"data.train=", two, anneal, "schedule.kind=wsd", "schedule.warmup_steps=700"}),
            where + "key 'data.stages': the decay (steps 600-1000) would start inside the warmup "
            "(schedule.warmup_steps=700)");
  const std::string by_tokens = "data.stages=[{until_tokens: 5000, weights: {a: 1}}, {weights: {b: 1}, anneal: true}]";
  EXPECT_EQ(config_error("", {"data.train=", two, by_tokens, "schedule.kind=wsd"}),
            "override '" + by_tokens + "': key 'data.stages': stage 2: anneal needs the stage before it to end at a "
            "step (until), not at a token count (until_tokens): the decay's first step must be known before the run");
  const std::string twice = "data.stages=[{until: 5, weights: {a: 1}, anneal: true}, {weights: {b: 1}, anneal: true}]";
  EXPECT_EQ(config_error("", {"data.train=", two, twice, "schedule.kind=wsd", "schedule.warmup_steps=0"}),
            "override '" + twice + "': key 'data.stages': stage 2: only one stage may start the decay (stage 1 has "
            "anneal: true)");
  // A run without a mixture has no stages at all.
  EXPECT_EQ(config_error("", {"data.stages=[{weights: {train: 1}, anneal: true}]", "schedule.kind=wsd"}),
            "override 'data.stages=[{weights: {train: 1}, anneal: true}]': key 'data.stages': stages need data.sources");
  EXPECT_NE(config_error("", {"data.train=", two, "data.stages=[{weights: {a: 1}, anneal: yes please}]"})
                .find("'anneal'"), std::string::npos);
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

// The row of `key` in describe_keys(), split into its cells (runs of two or more spaces apart).
std::vector<std::string> key_row(const std::string& table, const std::string& key) {
  std::istringstream in(table);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(key + " ", 0) != 0) continue;
    std::vector<std::string> cells;
    for (size_t at = 0; at < line.size();) {
      const size_t gap = line.find("  ", at);
      cells.push_back(line.substr(at, gap == std::string::npos ? std::string::npos : gap - at));
      if (gap == std::string::npos) break;
      at = line.find_first_not_of(' ', gap);
    }
    return cells;
  }
  ADD_FAILURE() << "no row for " << key;
  return {};
}

TEST(Config, KeysDescribeEveryKeyWithItsDefault) {
  const auto infos = key_infos();
  const auto keys = config_keys();
  ASSERT_EQ(infos.size(), keys.size());
  const std::string table = describe_keys();
  for (size_t i = 0; i < keys.size(); ++i) {
    EXPECT_EQ(infos[i].key, keys[i]);
    EXPECT_FALSE(infos[i].doc.empty()) << keys[i];
    EXPECT_FALSE(infos[i].allowed.empty()) << keys[i];
    EXPECT_EQ(infos[i].doc.find('\n'), std::string::npos) << keys[i] << ": one line";
    EXPECT_NE(table.find("\n" + keys[i] + " "), std::string::npos) << keys[i] << " has no row";
  }
  // The defaults are the default-constructed config's, as config.yaml writes them.
  EXPECT_EQ(key_row(table, "train.max_steps"), (std::vector<std::string>{"train.max_steps", "1000", ">= 1", "optimizer steps"}));
  EXPECT_EQ(key_row(table, "data.mode").at(1), "packed");
  EXPECT_EQ(key_row(table, "data.mode").at(2), "packed|bucketed");
  EXPECT_EQ(key_row(table, "model.dropout").at(2), "[0, 1)");
  EXPECT_EQ(key_row(table, "checkpoint.every_steps").at(2), ">= 0 or auto");
  EXPECT_EQ(key_row(table, "checkpoint.on_error").at(1), "stop");
  EXPECT_EQ(key_row(table, "data.workers").at(2), "[1, 256]");
  EXPECT_EQ(key_row(table, "run.dir").at(1), "runs/default");
  EXPECT_EQ(key_row(table, "optim.z_loss").at(1), "0");
  EXPECT_EQ(key_row(table, "optim.z_loss").at(2), ">= 0");
  EXPECT_EQ(key_row(table, "schedule.kind").at(2), "cosine|linear|constant|wsd");
  EXPECT_EQ(key_row(table, "schedule.decay_shape").at(1), "linear");
  EXPECT_EQ(key_row(table, "schedule.decay_shape").at(2), "linear|1-sqrt|cosine");
  EXPECT_EQ(key_row(table, "schedule.decay_fraction").at(2), "[0, 1]");
}

// Every range and choice that --keys shows is what load_config checks: a value just past a bound and
// a word that is not a choice are refused, a closed bound and each choice pass (the data.* ranges
// are checked by lm::validate, apart from the schema).
TEST(Config, KeysShowTheRangesLoadConfigChecks) {
  // The error of key=v, "" when it loads (a model key under an architecture that reads it).
  auto error_of = [](const std::string& key, const std::string& v) -> std::string {
    std::vector<std::string> overrides;
    if (key.rfind("model.", 0) == 0 && !arch_uses_key("gpt", key.substr(6))) overrides.push_back("model.arch=llama");
    if (key == "train.bf16_residual") overrides.push_back("train.dtype=bf16");  // what it needs
    if (key == "schedule.decay_shape") overrides.push_back("schedule.kind=wsd");
    if (key == "schedule.decay_shape" || (key == "schedule.kind" && v == "wsd"))
      overrides.push_back("schedule.decay_fraction=0.2");  // wsd needs its decay placed
    overrides.push_back(key + "=" + v);
    try {
      load_config("", overrides);
    } catch (const ConfigError& e) {
      return e.what();
    }
    return "";
  };
  auto refused = [&](const std::string& key, const std::string& v) {
    const std::string e = error_of(key, v);
    EXPECT_TRUE(e.empty() || e.find("key '" + key + "': ") != std::string::npos) << e;
    return !e.empty();
  };
  // A bound itself passes the range check (another rule, e.g. n_head dividing d_model, may refuse it).
  auto in_range = [&](const std::string& key, const std::string& v) {
    return error_of(key, v).find("key '" + key + "': must be") == std::string::npos;
  };
  auto past = [](const std::string& bound, double by) {  // bound + by, as an integer where it is one
    const double x = std::stod(bound) + by;
    return x == std::floor(x) ? std::to_string(static_cast<long long>(x)) : std::to_string(x);
  };
  int checked = 0;
  for (const auto& k : key_infos()) {
    std::string a = k.allowed;
    if (a.size() > 8 && a.compare(a.size() - 8, 8, " or auto") == 0) a.resize(a.size() - 8);
    if (a.rfind(">= ", 0) == 0) {
      EXPECT_TRUE(refused(k.key, past(a.substr(3), -1))) << k.key << " " << k.allowed;
      EXPECT_TRUE(in_range(k.key, a.substr(3))) << k.key << " " << k.allowed;
    } else if (a.rfind("> ", 0) == 0) {
      EXPECT_TRUE(refused(k.key, a.substr(2))) << k.key << " " << k.allowed;
    } else if (a[0] == '[' || a[0] == '(') {
      const size_t comma = a.find(", ");
      const std::string lo = a.substr(1, comma - 1), hi = a.substr(comma + 2, a.size() - comma - 3);
      EXPECT_TRUE(refused(k.key, a[0] == '(' ? lo : past(lo, -1))) << k.key << " " << k.allowed;
      EXPECT_TRUE(refused(k.key, a.back() == ')' ? hi : past(hi, 1))) << k.key << " " << k.allowed;
      if (a[0] == '[') {
        EXPECT_TRUE(in_range(k.key, lo)) << k.key << " " << k.allowed;
      }
      if (a.back() == ']') {
        EXPECT_TRUE(in_range(k.key, hi)) << k.key << " " << k.allowed;
      }
    } else if (a.find('|') != std::string::npos && a.find("path") == std::string::npos) {
      if (a.size() > 9 && a.compare(a.size() - 9, 9, " or empty") == 0) a.resize(a.size() - 9);
      EXPECT_TRUE(refused(k.key, "no_such_choice")) << k.key << " " << k.allowed;
      for (size_t at = 0; at <= a.size();) {
        const size_t bar = std::min(a.find('|', at), a.size());
        EXPECT_FALSE(refused(k.key, a.substr(at, bar - at))) << k.key << "=" << a.substr(at, bar - at);
        at = bar + 1;
      }
    } else {
      continue;  // free text: a path, a step range, a list
    }
    ++checked;
  }
  EXPECT_GE(checked, 70);  // of 84 keys; the rest are free text
}

// `trainer --keys` prints describe_keys() and exits 0 (needs build/bin/trainer: ninja trainer).
TEST(Config, TrainerKeysFlagPrintsTheTable) {
  if (!stdfs::exists(test::bin_path("trainer"))) GTEST_SKIP() << "build/bin/trainer is not built";
  const auto r = test::run_bin("trainer", {"--keys"});
  EXPECT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("\ncheckpoint.on_error "), std::string::npos) << r.out;
  EXPECT_EQ(r.out, describe_keys());
  const auto help = test::run_bin("trainer", {"--help"});
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_NE(help.out.find("trainer --keys"), std::string::npos) << help.out;
}

// The keys of issue 41 (optim.z_loss, schedule.kind wsd, schedule.decay_shape, decay_fraction, a
// stage's anneal) refused by the trainer itself: exit 2, one line naming the key, before any run.
// Checked to fail with the "wsd needs the decay placed" check removed (another key was named).
TEST(Config, TrainerRefusesBadScheduleAndZLossValues) {
  if (!stdfs::exists(test::bin_path("trainer"))) GTEST_SKIP() << "build/bin/trainer is not built";
  TempDir dir;
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"optim.z_loss=-1", "key 'optim.z_loss': must be in [0, inf)"},
      {"optim.z_loss=abc", "key 'optim.z_loss': expected a number"},
      {"schedule.kind=wsd", "key 'schedule.kind': wsd needs the decay placed"},
      {"schedule.decay_shape=sqrt", "key 'schedule.decay_shape': must be one of linear|1-sqrt|cosine"},
      {"schedule.decay_fraction=1.5", "key 'schedule.decay_fraction': must be in [0, 1]"},
      {"schedule.decay_fraction=0.1", "key 'schedule.decay_fraction': applies to schedule.kind=wsd only"},
      {"data.stages=[{weights: {train: 1}, anneal: 3}]", "'anneal': expected true or false"},
  };
  for (const auto& [override_, needle] : bad) {
    const auto r = test::run_bin("trainer", {test::source_path("configs/tiny.yaml"), "run.dir=" + dir / "run", override_});
    EXPECT_EQ(r.exit_code, 2) << override_ << ": " << r.out;
    EXPECT_NE(r.out.find(needle), std::string::npos) << override_ << ": " << r.out;
    EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << override_ << ": " << r.out;
    EXPECT_FALSE(stdfs::exists(dir / "run/metrics.jsonl")) << override_;
  }
}

// data.doc_mask in bucketed mode is refused (a bucketed row is one document already): exit 2, one
// line naming the key, before any run. Checked to fail with the refusal removed (the run started).
TEST(Config, TrainerRefusesDocMaskInBucketedMode) {
  if (!stdfs::exists(test::bin_path("trainer"))) GTEST_SKIP() << "build/bin/trainer is not built";
  TempDir dir;
  const auto r = test::run_bin("trainer", {test::source_path("configs/tiny.yaml"), "run.dir=" + dir / "run",
                                           "data.mode=bucketed", "data.doc_mask=true"});
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("key 'data.doc_mask': applies to data.mode=packed only (a bucketed row is one document already)"),
            std::string::npos)
      << r.out;
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;
  EXPECT_FALSE(stdfs::exists(dir / "run/metrics.jsonl"));
  EXPECT_NO_THROW(load_config(test::source_path("configs/tiny.yaml"), {"data.doc_mask=true"}));
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

// A second YAML document was silently ignored (its keys never applied): refused, naming the line
// where it starts. A lone "---" before the first document, or "..." after it, stays fine.
TEST(HostileConfig, ASecondYamlDocumentIsRefusedNamingItsLine) {
  TempDir tmp;
  test::write_text(tmp / "two.yaml", "train:\n  max_steps: 5\n---\noptim:\n  lr: 0.5\n");
  EXPECT_EQ(file_config_error(tmp / "two.yaml"),
            tmp / "two.yaml" + ":3: a second YAML document ('---'); a config file holds one document (the second would "
                               "be ignored): remove it or merge it into the first");
  test::write_text(tmp / "empty2.yaml", "---\ntrain:\n  max_steps: 5\n---\n");
  EXPECT_NE(file_config_error(tmp / "empty2.yaml").find("empty2.yaml:4: a second YAML document"), std::string::npos);
  test::write_text(tmp / "one.yaml", "---\ntrain:\n  max_steps: 5\n...\n");
  EXPECT_EQ(load_config(tmp / "one.yaml", {}).train.max_steps, 5);
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

// eval.tasks: a list of {name, path, kind}, kind defaulting to multiple_choice, printed back and read
// again from config.yaml's text; a bad entry is one line naming the key, the file's line and the
// entry. Checked to fail with the duplicate-name check removed from parse_tasks.
TEST(Config, EvalTasksParsePrintAndRefuse) {
  TempDir dir;
  write_text(dir / "c.yaml", "eval:\n  tasks:\n    - {name: cloze, path: /x/c.jsonl}\n    - name: hs\n      path: h.jsonl\n"
                             "      kind: multiple_choice\n");
  const auto c = load_config(dir / "c.yaml", {});
  ASSERT_EQ(c.eval.tasks.size(), 2u);
  EXPECT_EQ(c.eval.tasks[0].name, "cloze");
  EXPECT_EQ(c.eval.tasks[0].path, "/x/c.jsonl");
  EXPECT_EQ(c.eval.tasks[0].kind, "multiple_choice");
  EXPECT_EQ(c.eval.tasks[1].path, "h.jsonl");
  write_text(dir / "back.yaml", to_yaml(c));
  const auto back = load_config(dir / "back.yaml", {});
  ASSERT_EQ(back.eval.tasks.size(), 2u);
  EXPECT_EQ(back.eval.tasks[1].name, "hs");
  EXPECT_EQ(load_config("", {"eval.tasks=[{name: a, path: b}]"}).eval.tasks.at(0).path, "b");
  EXPECT_TRUE(load_config("", {}).eval.tasks.empty());
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"eval.tasks=[{name: a}]", "entry 1 (line 1): needs a name and a path"},
      {"eval.tasks=[{path: a}]", "entry 1 (line 1): needs a name and a path"},
      {"eval.tasks=[{name: a b, path: x}]", "name 'a b': letters, digits"},
      {"eval.tasks=[{name: a, path: x, kind: generate}]", "kind 'generate': the one kind is multiple_choice"},
      {"eval.tasks=[{name: a, path: x}, {name: a, path: y}]", "entry 2 (line 1): a second task named 'a'"},
      {"eval.tasks=[{name: a, path: x, label: 1}]", "unknown key 'label'"},
      {"eval.tasks=a.jsonl", "expected a list of maps"},
  };
  for (const auto& [ov, needle] : bad) {
    const std::string msg = config_error("", {ov});
    EXPECT_NE(msg.find("key 'eval.tasks'"), std::string::npos) << ov << ": " << msg;
    EXPECT_NE(msg.find(needle), std::string::npos) << ov << ": " << msg;
  }
  EXPECT_NE(config_error("eval:\n  tasks:\n    - {name: a}\n").find("c.yaml:3"), std::string::npos);
}

}  // namespace
}  // namespace lm
