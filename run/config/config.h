// The experiment config: every component's Config composed under its YAML section, and the one
// place that turns YAML files and "dotted.key=value" overrides into these structs.
//
// Precedence: command-line overrides > YAML file > defaults. Strict: an unknown key is rejected
// naming the closest valid key; a wrong type or out-of-range value names the key (and FILE:LINE
// when it came from the file); a YAML syntax error names the line. All throw ConfigError.
//
// Each key's description and allowed values are in its section's describe_<section>() beside the
// struct that owns the section (the list: describe() in config.cpp); `trainer --keys` (describe_keys()
// below) prints them with the defaults of those structs.
#pragma once

#include <string>
#include <vector>

#include "common/text.h"
#include "data/loader/data_config.h"
#include "models/model_config.h"
#include "run/config/checkpoint_config.h"
#include "run/config/train_config.h"
#include "run/config/eval_config.h"
#include "run/config/optim_config.h"
#include "run/config/dist_config.h"
#include "run/config/telemetry_config.h"

namespace lm {

struct ExperimentConfig {
  RunConfig run;
  DataConfig data;
  ModelConfig model;
  OptimConfig optim;
  ScheduleConfig schedule;
  TrainConfig train;
  LogConfig log;
  EvalConfig eval;
  CheckpointConfig checkpoint;
  DistConfig dist;
  AnomalyConfig anomaly;
};

// Loads `path` (empty = defaults only), applies `overrides` in order, validates.
ExperimentConfig load_config(const std::string& path, const std::vector<std::string>& overrides);

// The resolved config as YAML; load_config() of it gives the same config back.
std::string to_yaml(const ExperimentConfig& cfg);
// A "key  value" table, one row per key; values that differ from the default are marked '*'.
std::string to_table(const ExperimentConfig& cfg);
// Every valid dotted key, in schema order.
std::vector<std::string> config_keys();
// One key as `trainer --keys` shows it: its default (as config.yaml writes it), its allowed values
// and its one description.
struct KeyInfo {
  std::string key, default_value, allowed, doc;
};
std::vector<KeyInfo> key_infos();  // every key, in schema order
// key_infos() as an aligned table with a header row: KEY, DEFAULT, ALLOWED, DESCRIPTION.
std::string describe_keys();
// The resolved config as nested JSON text ({"run": {"dir": ..., "seed": ...}, ...}), typed values.
std::string to_json(const ExperimentConfig& cfg);

}  // namespace lm
