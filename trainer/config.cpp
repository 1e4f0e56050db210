// YAML file + overrides -> ExperimentConfig (see config.h). describe() below is the single list of
// every public config key: its type, its allowed values and its one description (`trainer --keys`).
#include "trainer/config.h"

#include <nlohmann/json.hpp>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <sstream>

#include "common/errors.h"
#include "common/text.h"
#include "models/registry.h"
#include "trainer/config_schema.h"
#include "trainer/config_values.h"
#include "trainer/config_yaml.h"
#include "trainer/telemetry/profiler.h"

namespace lm {
namespace {

using namespace config_values;
using config_schema::Field;
using config_schema::Schema;
using config_schema::choices_text;

// Where a value came from, for error messages: "configs/x.yaml:12" or "override 'a.b=c'".
using Where = std::string;

// THE list of config keys: each key's type, allowed values and its one description (printed by
// `trainer --keys`). Defaults live in the component Config structs.
void describe_data(Schema& s, DataConfig& d) {
  // data.*: the parser checks types and choices; the data component owns the ranges (lm::validate,
  // data_config.cpp, from data_ranges), shown here through integer_checked_later.
  auto later = [&s](const std::string& key, int64_t* p, const std::string& doc, IntRange r) {
    s.integer_checked_later(key, p, doc, r.lo, r.hi < 0 ? Schema::kNoMax : r.hi);
  };
  // data.train, data.text and data.text_field become the one source "train" (resolve_train_form)
  // and are printed back from it.
  DataConfig* dp = &d;
  auto train_key = [dp](std::string SourceConfig::*m, const std::string* raw) {
    return [=] { return dp->train_form ? dp->sources.at(0).*m : *raw; };
  };
  s.text("data.train", &d.train, "the training data: a prep output directory, its http(s):// or s3:// URL, or raw text "
         "files (data.text); or use data.sources", "path or URL", train_key(&SourceConfig::path, &d.train));
  s.structured("data.sources", sources_doc(), "list of maps",
               [dp](const YAML::Node& n) { parse_sources(n, &dp->sources); },
               [dp] { return print_sources(dp->train_form ? std::vector<SourceConfig>{} : dp->sources); });
  s.structured("data.stages", "mixture stages: [{until: STEP | until_tokens: N, weights: {name: w}, anneal: "
               "false}]; empty = the sources' weights throughout; anneal: true (schedule.kind wsd, one stage, after a "
               "stage ending at a step): the lr's decay starts at the stage's first step", "list of maps",
               [dp](const YAML::Node& n) { parse_stages(n, &dp->stages); }, [dp] { return print_stages(dp->stages); });
  s.text("data.text", &d.text, "raw text in data.train: one document per line, paragraph or jsonl record; empty = a "
         "prepared dataset", choices_text(data_choices::text), train_key(&SourceConfig::text, &d.text));
  s.text("data.text_field", &d.text_field, "raw text, jsonl: the field holding the text", "field name",
         train_key(&SourceConfig::text_field, &d.text_field));
  s.text("data.tokenizer", &d.tokenizer, "raw text: bytes, or a sentencepiece .model file (e.g. a prep output's "
         "tokenizer.model)", "bytes or path");
  s.number("data.val_fraction", &d.val_fraction, "raw text: share of documents in the val split (as prep --val-fraction)",
           0, false, 1, false);
  s.integer("data.split_seed", &d.split_seed, "raw text: seed of the document hash deciding the split (as prep "
            "--split-seed)", data_ranges::split_seed.lo);
  s.text("data.val", &d.val, "validation dataset directory or URL; empty = the val split of data.train (or of the "
         "first source)", "path or URL");
  s.choice("data.mode", &d.mode, "packed: EOS-joined windows of model.seq_len+1 tokens; bucketed: one document per "
           "sample, in padded batches", data_choices::mode);
  later("data.workers", &d.workers, "loader threads building batches", data_ranges::workers);
  later("data.prefetch", &d.prefetch, "batches built ahead of the training loop (queue depth)", data_ranges::prefetch);
  s.boolean("data.shuffle", &d.shuffle, "shuffle shard order and samples (else the manifest's order)");
  later("data.shuffle_buffer", &d.shuffle_buffer, "samples per shuffle block (and per bucketing block)",
        data_ranges::shuffle_buffer);
  s.choice("data.long_docs", &d.long_docs, "bucketed: a document over model.seq_len+1 tokens is truncated or split",
           data_choices::long_docs);
  later("data.pad_multiple", &d.pad_multiple, "bucketed: a batch's length is padded up to a multiple of this; "
        "1 = no padding", data_ranges::pad_multiple);
  later("data.token_budget", &d.token_budget, "bucketed: padded tokens per rank, rows chosen so that rows x padded "
        "length <= this (at least model.seq_len); 0 = train.micro_batch_size rows", data_ranges::token_budget);
  s.choice("data.verify", &d.verify, "shard checksums: lazy = each shard on its first open, full = all at start",
           data_choices::verify);
  s.boolean("data.reuse_batch", &d.reuse_batch, "benchmark only: every step re-trains the first step's batches (no reading)");
  s.boolean("data.doc_mask", &d.doc_mask, "packed: attention never crosses a document boundary (an EOS token ends its "
            "document) and positions (gpt's learned ones, llama's RoPE) restart at each document; validation too; "
            "refused with data.mode=bucketed (a row is one document)");
  s.text("data.cache_dir", &d.cache_dir, "remote datasets: the local shard cache, shared by every run that names it",
         "non-empty path");
  s.number("data.cache_limit_mb", &d.cache_limit_mb, "remote datasets: MiB the shard cache may hold", 0, true);
  s.number("data.remote_timeout_s", &d.remote_timeout_s, "remote datasets: seconds a fault may last before the run "
           "ends (after a checkpoint)", 0, true);
  later("data.remote_ahead", &d.remote_ahead, "remote datasets: shards fetched ahead of the shuffle block in use",
        data_ranges::remote_ahead);
}

void describe_model(Schema& s, ModelConfig& m) {
  s.choice("model.arch", &m.arch, "model architecture (models/registry.h)", arch_names());
  s.integer("model.n_layer", &m.n_layer, "transformer blocks", 1, 1024);
  s.integer("model.n_head", &m.n_head, "attention heads; must divide model.d_model", 1, 1024);
  s.integer("model.d_model", &m.d_model, "residual width", 1, 1 << 16);
  s.integer("model.seq_len", &m.seq_len, "context length in tokens (gpt: learned positions; llama: the RoPE table)",
            1, 1 << 20);
  s.number("model.dropout", &m.dropout, "gpt: dropout probability on embeddings, attention weights and residual "
           "branches", 0, false, 1, true);
  s.integer("model.vocab_size", &m.vocab_size, "vocabulary size; 0 = the data manifest's vocabulary", 0);
  s.integer("model.vocab_multiple", &m.vocab_multiple, "vocabulary padded up to a multiple of this", 1);
  s.number("model.init_std", &m.init_std, "std of the normal weight init (see each architecture's init_weights)", 0, true);
  s.text("model.init_from", &m.init_from, "Hugging Face directory (model.safetensors) to start from; empty = fresh init",
         "path or empty");
  s.integer("model.n_kv_head", &m.n_kv_head, "llama: key/value heads (grouped-query attention); 0 = model.n_head", 0, 1024);
  s.number("model.norm_eps", &m.norm_eps, "llama: RMSNorm epsilon", 0, true);
  s.number("model.rope_theta", &m.rope_theta, "llama: RoPE base", 0, true);
  s.integer("model.ffn_multiple_of", &m.ffn_multiple_of, "llama: SwiGLU hidden width rounded up to a multiple of this", 1);
  s.number("model.ffn_dim_multiplier", &m.ffn_dim_multiplier, "llama: SwiGLU hidden width multiplier; 0 = none (Llama's "
           "None)", 0, false);
  s.boolean("model.tie_embeddings", &m.tie_embeddings, "llama: the output head shares the token embedding");
}

void describe_training(Schema& s, ExperimentConfig& c);
void describe_telemetry(Schema& s, ExperimentConfig& c);

void describe(Schema& s, ExperimentConfig& c) {
  s.text("run.dir", &c.run.dir, "run directory: config, metrics, logs, checkpoints", "non-empty path");
  s.integer("run.seed", &c.run.seed, "seed of model init, dropout and data order", 0);
  s.boolean("run.skip_memory_check", &c.run.skip_memory_check, "start even when the memory estimate exceeds what is "
            "available");
  describe_data(s, c.data);
  describe_model(s, c.model);
  describe_training(s, c);
}

// The optimizer, schedule, training and checkpoint keys.
void describe_training(Schema& s, ExperimentConfig& c) {
  std::vector<std::string> optimizers;
  for (const auto& k : optimizer_kinds()) optimizers.push_back(k.name);
  s.choice("optim.name", &c.optim.name, "the optimizer (trainer/optim/optimizer.h): adamw = AdamW with decoupled weight "
           "decay, as torch.optim.AdamW", optimizers);
  s.number("optim.lr", &c.optim.lr, "peak learning rate (after warmup)", 0, true);
  s.number("optim.beta1", &c.optim.beta1, "AdamW first-moment decay", 0, false, 1, true);
  s.number("optim.beta2", &c.optim.beta2, "AdamW second-moment decay", 0, false, 1, true);
  s.number("optim.eps", &c.optim.eps, "AdamW denominator epsilon", 0, true);
  s.number("optim.weight_decay", &c.optim.weight_decay, "decoupled weight decay, of matrices only (not biases, norms, "
           "embeddings)", 0, false);
  s.number("optim.grad_clip", &c.optim.grad_clip, "max global gradient norm; 0 = no clipping", 0, false);
  s.choice("optim.fused", &c.optim.fused, "the update as at::_fused_adamw_, a non-finite step skipped on the device: "
           "auto = on CUDA (LibTorch >= 2.1), on = also on CPU (LibTorch >= 2.4), off = the flat update",
           {"auto", "on", "off"});
  s.choice("optim.free_grads", &c.optim.free_grads, "per-parameter gradients left undefined between steps (backward "
           "allocates them) instead of one flat buffer zeroed every step; needs the fused AdamW and one rank: "
           "auto = on CUDA where both hold", {"auto", "on", "off"});
  s.choice("optim.clip_in_step", &c.optim.clip_in_step, "clip inside the fused AdamW (its grad_scale) instead of a pass "
           "over the gradients; needs the fused AdamW: auto = on CUDA where it runs", {"auto", "on", "off"});

  s.number("optim.z_loss", &c.optim.z_loss, "z-loss: z_loss x logsumexp(logits)^2 added per target token to the "
           "objective (PaLM used 1e-4), logged apart as z_loss (the loss stays the cross-entropy); 0 = off", 0, false);

  s.choice("schedule.kind", &c.schedule.kind, "learning-rate schedule after the linear warmup; wsd = warmup, stable at "
           "optim.lr, then a decay to the floor (schedule.decay_steps, decay_fraction or an anneal stage place it)",
           {"cosine", "linear", "constant", "wsd"});
  s.integer("schedule.warmup_steps", &c.schedule.warmup_steps, "steps of linear warmup from 0 to optim.lr", 0);
  s.number("schedule.min_lr_ratio", &c.schedule.min_lr_ratio, "cosine, linear and wsd end at optim.lr x this", 0, false, 1);
  s.integer("schedule.decay_steps", &c.schedule.decay_steps, "cosine, linear: the step at which the decay ends, 0 = "
            "train.max_steps; wsd: the decay's length in steps, ending at train.max_steps (or starting at the anneal "
            "stage), 0 = schedule.decay_fraction", 0);
  s.choice("schedule.decay_shape", &c.schedule.decay_shape, "wsd: the decay's shape, progress p from 0 to 1: linear "
           "(1 - p), 1-sqrt (1 - sqrt(p)) or cosine", {"linear", "1-sqrt", "cosine"});
  s.number("schedule.decay_fraction", &c.schedule.decay_fraction, "wsd: the decay's length as a share of "
           "train.max_steps (torchtitan's decay_ratio); 0 = schedule.decay_steps or the anneal stage gives it",
           0, false, 1, false);

  s.integer("train.max_steps", &c.train.max_steps, "optimizer steps", 1);
  s.integer("train.micro_batch_size", &c.train.micro_batch_size, "sequences per micro-batch (one forward/backward)", 1);
  s.integer("train.grad_accum", &c.train.grad_accum, "micro-batches per optimizer step", 1);
  s.integer("train.threads", &c.train.threads, "math threads of each rank (OpenBLAS's pool where LibTorch uses OpenBLAS, else LibTorch intra-op); 0 = 1 on CPU, LibTorch's default on CUDA", 0, 1024);
  s.choice("train.device", &c.train.device, "compute device; auto = cuda when available, else cpu", {"auto", "cpu", "cuda"});
  s.choice("train.dtype", &c.train.dtype, "compute dtype; bf16 = autocast with fp32 master weights and optimizer state "
           "(CPU: LibTorch >= 2.4)", {"fp32", "bf16"});
  s.choice("train.fused_loss", &c.train.fused_loss, "the LM head and the cross-entropy as one function: the logits "
           "never in fp32, the softmax overwritten by its gradient; auto = on CUDA; the validation loss stays the "
           "plain path", {"auto", "on", "off"});
  s.boolean("train.bf16_residual", &c.train.bf16_residual, "the residual stream and the norms in bf16 (llm.c's "
            "layout) instead of fp32; needs train.dtype=bf16");
  s.choice("train.activation_checkpointing", &c.train.activation_checkpointing, "block = each transformer block "
           "keeps only its input (B,T,C) for the backward, which runs the block's forward again (the same dropout and "
           "autocast): the activations of one block instead of all, for one more forward per step; none = all kept",
           {"none", "block"});
  s.number("train.ema_decay", &c.train.ema_decay, "EMA of the weights, updated every step; 0 = off", 0, false, 1, true);

  s.integer_or_auto("checkpoint.every_steps", &c.checkpoint.every_steps, "save every N steps; 0 = only at the end; "
                    "auto = the Young/Daly interval from checkpoint.mtbf_hours", 0);
  s.number("checkpoint.mtbf_hours", &c.checkpoint.mtbf_hours, "every_steps auto: hours between failures of one node "
           "(the job's MTBF is this / nodes)", 0, true);
  s.integer("checkpoint.keep_last", &c.checkpoint.keep_last, "newest checkpoints kept; 0 = all", 0);
  s.integer("checkpoint.keep_every", &c.checkpoint.keep_every, "checkpoints at multiples of this step are never "
            "deleted; 0 = none", 0);
  s.text("checkpoint.resume", &c.checkpoint.resume, "auto = the newest valid checkpoint in run.dir, none = fresh "
         "start, or a checkpoint directory", "auto|none|path");
  s.boolean("checkpoint.force", &c.checkpoint.force, "resume even when the model architecture or data version differ");
  s.boolean("checkpoint.async", &c.checkpoint.async, "snapshot, then write checkpoints in the background while "
            "training continues");
  s.number("checkpoint.write_pace", &c.checkpoint.write_pace, "async saves: the share of the checkpoint interval (in "
           "step time) the disk writes are spread over, so that they take less CPU from the steps; 0 = as fast as "
           "the disk takes them", 0, false, 1, false);
  s.choice("checkpoint.on_error", &c.checkpoint.on_error, "a failed save: stop = exit 1, continue = warn and keep "
           "training", {"stop", "continue"});
  s.number("checkpoint.commit_timeout_s", &c.checkpoint.commit_timeout_s, "seconds rank 0 waits for the other ranks' "
           "checkpoint files", 0, true);
  describe_telemetry(s, c);
}

// The distributed, logging, anomaly and evaluation keys.
void describe_telemetry(Schema& s, ExperimentConfig& c) {
  describe_dist(s, c.dist);  // trainer/parallel/dist_config.cpp

  s.integer("log.every_steps", &c.log.every_steps, "a console line, metrics.jsonl and TensorBoard record every N steps", 1);
  s.number("log.peak_tflops", &c.log.peak_tflops, "per-device peak TFLOP/s for MFU; 0 = the datasheet peak of a "
           "known GPU (H100, H200, A100; other GPUs: no MFU), on CPU an SGEMM peak measured during the run", 0, false);
  s.number("log.long_window_s", &c.log.long_window_s, "seconds per long-window aggregate (mean/min/max tokens/s and MFU)",
           0, true);
  s.boolean("log.tensorboard", &c.log.tensorboard, "write a TensorBoard event file in run.dir");
  s.text("log.profile_steps", &c.log.profile_steps,
         "A-B: a Chrome trace of steps A..B and its top ops or GPU kernels (top.json) in RUN_DIR/profile/; empty = off",
         "A-B (1 <= A <= B) or empty");

  s.number("anomaly.spike_factor", &c.anomaly.spike_factor, "a loss above this times its running mean is a spike; 0 = off",
           0, false);
  s.integer("anomaly.window", &c.anomaly.window, "steps in the loss's running mean", 1);
  s.integer("anomaly.warmup_steps", &c.anomaly.warmup_steps, "no spike checks before this step (non-finite values always "
            "count)", 0);
  s.choice("anomaly.action", &c.anomaly.action, "on an anomaly: continue, skip (no weight update) or stop (checkpoint, "
           "exit 1)", {"continue", "skip", "stop"});
  s.integer("anomaly.max_dumps", &c.anomaly.max_dumps, "anomaly directories written at most", 0);

  s.integer("eval.every_steps", &c.eval.every_steps, "validation loss (and eval.tasks) every N steps and at the end; 0 = only at the end", 0);
  s.integer("eval.batches", &c.eval.batches, "validation micro-batches per evaluation; 0 = no validation", 0);
  EvalConfig* ep = &c.eval;
  s.structured("eval.tasks", "downstream tasks scored at the start, every eval.every_steps and at the end: "
               "[{name, path, kind: multiple_choice}], each a JSONL file of {\"context\": text, \"choices\": [text, "
               "...], \"label\": i}; acc = the choice of highest log-likelihood given the context is the label, "
               "acc_norm = the same per byte of the choice (lm-eval's acc_norm); context + choice cut from the left "
               "to model.seq_len; empty = none", "list of maps",
               [ep](const YAML::Node& n) { parse_tasks(n, &ep->tasks); }, [ep] { return print_tasks(ep->tasks); });
}
std::string closest_key(const Schema& s, const std::string& key) {
  std::string best;
  size_t best_d = std::numeric_limits<size_t>::max();
  if (key.find('.') == std::string::npos) {  // an unknown section: the closest section
    for (auto& f : s.fields()) {
      std::string sec = f.key.substr(0, f.key.find('.'));
      size_t d = edit_distance(key, sec);
      if (d < best_d) best_d = d, best = sec;
    }
    return best;
  }
  // Compare the whole key, and the leaf alone (so "optim.learning_rate" finds "optim.lr" less
  // well than "train.lr" would find "optim.lr").
  auto leaf = [](const std::string& k) { auto p = k.rfind('.'); return p == std::string::npos ? k : k.substr(p + 1); };
  for (auto& f : s.fields()) {
    size_t d = std::min(edit_distance(key, f.key), edit_distance(leaf(key), leaf(f.key)) + 1);
    if (d < best_d) best_d = d, best = f.key;
  }
  return best;
}

// A key over 256 bytes gets no suggestion (the distances cost |key| x |candidate| each; a hostile
// 40 kB key took seconds, found by tests/fuzz) and is shown cut to its first 80 bytes.
[[noreturn]] void unknown_key(const Schema& s, const std::string& where, const std::string& key) {
  if (key.size() > 256)
    throw ConfigError(where + ": unknown key '" + key.substr(0, 80) + "...' (" + std::to_string(key.size()) + " bytes)");
  throw ConfigError(where + ": unknown key '" + key + "' (did you mean '" + closest_key(s, key) + "'?)");
}

std::string file_where(const std::string& path, const YAML::Node& n) {
  auto m = n.Mark();
  return m.line >= 0 ? path + ":" + std::to_string(m.line + 1) : path;
}

// Where each key's value came from ("FILE:LINE" or "override '...'"), for errors found later.
using Origins = std::map<std::string, std::string>;

void apply(const Schema& s, const std::string& where, const std::string& key, const YAML::Node& n,
           Origins* origins = nullptr) {
  const Field* f = s.find(key);
  if (!f) unknown_key(s, where, key);
  try {
    f->set(n);
  } catch (const BadValue& e) {
    throw ConfigError(where + ": key '" + key + "': " + e.what());
  }
  if (origins) (*origins)[key] = where;
}

// Walks a YAML map, applying leaves as dotted keys.
void walk(const Schema& s, const std::string& path, const std::string& prefix, const YAML::Node& node,
          Origins* origins) {
  std::map<std::string, int> seen;  // key -> line, to refuse duplicates (YAML says keys are unique)
  for (auto it = node.begin(); it != node.end(); ++it) {
    if (!it->first.IsScalar())
      throw ConfigError(file_where(path, it->first) + ": a key must be a plain name, not a " +
                        (it->first.IsSequence() ? "list" : it->first.IsMap() ? "map" : "null"));
    std::string name = it->first.Scalar();
    std::string key = prefix.empty() ? name : prefix + "." + name;
    const int line = it->first.Mark().line + 1;
    if (auto [at, fresh] = seen.emplace(name, line); !fresh)
      throw ConfigError(file_where(path, it->first) + ": duplicate key '" + key + "' (first set on line " +
                        std::to_string(at->second) + ")");
    const YAML::Node v = it->second;  // a copy (a handle): it->second lives in a temporary proxy
    if (v.IsMap()) {
      if (s.find(key)) apply(s, file_where(path, it->first), key, v);  // gives "expected a single value"
      if (!s.is_section(key)) unknown_key(s, file_where(path, it->first), key);
      walk(s, path, key, v, origins);
    } else {
      if (!s.find(key) && s.is_section(key))
        throw ConfigError(file_where(path, it->first) + ": key '" + key + "' is a section; expected a map of keys under it");
      apply(s, v.IsNull() ? file_where(path, it->first) : file_where(path, v), key, v, origins);
    }
  }
}

// dist.invariant: what the fixed summation tree covers so far (trainer/parallel/invariant.h).
static void check_invariant(const ExperimentConfig& c) {
  if (!c.dist.invariant) return;
  if (c.data.token_budget > 0)
    throw ConfigError("key 'data.token_budget': dist.invariant needs micro-batches of train.micro_batch_size rows; set "
                      "data.token_budget=0");
  if (c.data.bucketed())
    throw ConfigError("key 'data.mode': dist.invariant runs packed batches only (data.mode=packed)");
  if (!c.data.train_form && !c.data.sources.empty())
    throw ConfigError("key 'data.sources': dist.invariant runs one data stream (data.train) only, not a mixture");
  if (c.dist.zero != 0)
    throw ConfigError("key 'dist.zero': dist.invariant keeps the optimizer state whole on every rank; set dist.zero=0");
}

void validate(const ExperimentConfig& c, const Origins& origins) {
  try {
    lm::validate(c.data, c.model.seq_len);
  } catch (const ConfigError& e) {  // "key 'data.X': ...": say where data.X was set
    const std::string msg = e.what();
    const auto q = msg.find('\'', 5);
    auto it = msg.rfind("key '", 0) == 0 && q != std::string::npos ? origins.find(msg.substr(5, q - 5)) : origins.end();
    if (it == origins.end()) throw;
    throw ConfigError(it->second + ": " + msg);
  }
  validate_model(c.model);
  if (c.run.dir.empty()) throw ConfigError("key 'run.dir': must not be empty");
  if (int64_t a = 0, b = 0; !c.log.profile_steps.empty() && !parse_step_range(c.log.profile_steps, &a, &b))
    throw ConfigError("key 'log.profile_steps': expected A-B with 1 <= A <= B, got '" + c.log.profile_steps + "'");
  if (c.checkpoint.resume.empty()) throw ConfigError("key 'checkpoint.resume': must be auto, none or a directory");
  if (c.train.bf16_residual && !c.train.bf16())
    throw ConfigError("key 'train.bf16_residual': needs train.dtype=bf16 (it is " + c.train.dtype + ")");
}

// The schedule's rules across keys (after validate(): data.stages are well formed), and wsd's
// anneal_start from the anneal stage. wsd's keys (but at their defaults) and an anneal stage only
// with schedule.kind=wsd; one anneal stage, after a stage that ends at a step; wsd's decay
// (wsd_decay_window) given by decay_steps or decay_fraction (not both), or an anneal stage (its
// start; with one of the two, its length), at least one step long, inside [warmup_steps, max_steps].
void resolve_schedule(ExperimentConfig& c, const Origins& origins) {
  ScheduleConfig& s = c.schedule;
  auto fail = [&](const std::string& key, const std::string& why) {
    const auto it = origins.find(key);
    throw ConfigError((it == origins.end() ? "" : it->second + ": ") + "key '" + key + "': " + why);
  };
  const auto& stages = c.data.stages;
  int64_t anneal = -1;
  size_t anneal_stage = 0;
  for (size_t i = 0; i < stages.size(); ++i) {
    if (!stages[i].anneal) continue;
    const std::string who = "stage " + std::to_string(i + 1);
    if (!s.wsd()) fail("data.stages", who + ": anneal needs schedule.kind=wsd (it is " + s.kind + ")");
    if (anneal >= 0)
      fail("data.stages", who + ": only one stage may start the decay (stage " + std::to_string(anneal_stage + 1) +
                              " has anneal: true)");
    if (i > 0 && stages[i - 1].until_step == 0)
      fail("data.stages", who + ": anneal needs the stage before it to end at a step (until), not at a token count "
                                "(until_tokens): the decay's first step must be known before the run");
    anneal = i == 0 ? 0 : stages[i - 1].until_step, anneal_stage = i;
  }
  s.anneal_start = -1;
  if (!s.wsd()) {  // only their defaults (config.yaml writes every key)
    const ScheduleConfig def;
    if (s.decay_shape != def.decay_shape) fail("schedule.decay_shape", "applies to schedule.kind=wsd only (it is " + s.kind + ")");
    if (s.decay_fraction != def.decay_fraction)
      fail("schedule.decay_fraction", "applies to schedule.kind=wsd only (it is " + s.kind + ")");
    return;
  }
  if (s.decay_steps > 0 && s.decay_fraction > 0)
    fail("schedule.decay_fraction", "set either schedule.decay_steps or schedule.decay_fraction, not both");
  if (s.decay_steps <= 0 && s.decay_fraction <= 0 && anneal < 0)
    fail("schedule.kind", "wsd needs the decay placed: schedule.decay_steps, schedule.decay_fraction or a data.stages "
                          "entry with anneal: true");
  s.anneal_start = anneal;
  const int64_t max_steps = c.train.max_steps;
  const DecayWindow d = wsd_decay_window(s, max_steps);
  const std::string range = "steps " + std::to_string(d.start) + "-" + std::to_string(d.end);
  const std::string max_text = "train.max_steps=" + std::to_string(max_steps);
  if (anneal >= 0) {
    if (d.start >= max_steps)
      fail("data.stages", "stage " + std::to_string(anneal_stage + 1) + " starts at step " + std::to_string(d.start) +
                              ", not before " + max_text + ": the decay would never start");
  }
  const std::string len_key = s.decay_steps > 0 ? "schedule.decay_steps" : "schedule.decay_fraction";
  if (anneal >= 0 && d.end > max_steps)
    fail(len_key, "the decay from the anneal stage (" + range + ") ends after " + max_text);
  const std::string by = anneal >= 0 && d.end - d.start >= 1 ? "data.stages" : len_key;
  if (d.end - d.start < 1)
    fail(by, "the decay is " + std::to_string(d.end - d.start) + " steps of " + max_text + "; it needs at least 1");
  if (d.start < 0) fail(by, "the decay (" + std::to_string(d.end - d.start) + " steps) is longer than " + max_text);
  if (d.start < s.warmup_steps)
    fail(by, "the decay (" + range + ") would start inside the warmup (schedule.warmup_steps=" +
                 std::to_string(s.warmup_steps) + ")");
}

// A model key the architecture does not read may be set only to its default (so one base file can
// serve both architectures of a sweep); any other value is refused where it was set.
void check_arch_keys(const Schema& s, const ExperimentConfig& c, const Origins& origins) {
  ExperimentConfig def;
  Schema d;
  describe(d, def);
  for (const auto& [key, where] : origins) {
    if (key.rfind("model.", 0) != 0 || arch_uses_key(c.model.arch, key.substr(6))) continue;
    const std::string v = s.find(key)->get(), dv = d.find(key)->get();
    if (v != dv)
      throw ConfigError(where + ": key '" + key + "' does not apply to model.arch=" + c.model.arch +
                        " (only its default, " + dv + ", is accepted)");
  }
}

// Whether the resolved config shows `key`: not the model keys its architecture does not read.
bool shown(const ExperimentConfig& c, const std::string& key) {
  return key.rfind("model.", 0) != 0 || arch_uses_key(c.model.arch, key.substr(6));
}

}  // namespace

ExperimentConfig load_config(const std::string& path, const std::vector<std::string>& overrides) {
  ExperimentConfig cfg;
  Schema s;
  describe(s, cfg);
  Origins origins;
  if (!path.empty()) {
    const YAML::Node root = load_yaml_file(path, "config file");
    if (root.IsNull()) {
      // empty file: defaults
    } else if (!root.IsMap()) {
      throw ConfigError(file_where(path, root) + ": expected a map of sections at the top level");
    } else {
      try {
        walk(s, path, "", root, &origins);
      } catch (const YAML::Exception& e) {  // e.g. a list or map as a key (found by tests/fuzz)
        throw ConfigError(path + ":" + std::to_string(e.mark.line + 1) + ": " + e.msg + " (keys are plain names)");
      }
    }
  }
  for (const auto& ov : overrides) {
    auto eq = ov.find('=');
    std::string where = "override '" + ov + "'";
    if (eq == std::string::npos || eq == 0)
      throw ConfigError(where + ": expected dotted.key=value");
    std::string key = ov.substr(0, eq), text = ov.substr(eq + 1);
    if (const size_t bad_at = invalid_utf8_at(ov); bad_at != std::string::npos)
      throw ConfigError("override '" + ov.substr(0, bad_at) + "...': not valid UTF-8 at byte " + std::to_string(bad_at));
    // Every key holds one value: the override's text is that value, verbatim (so "a: b" is a
    // string, not a map); an empty value is missing.
    apply(s, where, key, text.empty() ? YAML::Node(YAML::NodeType::Null) : YAML::Node(text), &origins);
  }
  check_arch_keys(s, cfg, origins);
  validate(cfg, origins);
  resolve_schedule(cfg, origins);
  resolve_train_form(cfg.data);
  check_invariant(cfg);
  return cfg;
}

std::string to_yaml(const ExperimentConfig& cfg_in) {
  ExperimentConfig cfg = cfg_in;
  Schema s;
  describe(s, cfg);
  std::ostringstream out;
  std::string section;
  for (auto& f : s.fields()) {
    if (!shown(cfg, f.key)) continue;
    auto dot = f.key.find('.');
    std::string sec = f.key.substr(0, dot), leaf = f.key.substr(dot + 1);
    if (sec != section) {
      out << sec << ":\n";
      section = sec;
    }
    out << "  " << leaf << ": " << f.get() << "\n";
  }
  return out.str();
}

std::string to_table(const ExperimentConfig& cfg_in) {
  ExperimentConfig cfg = cfg_in, def;
  Schema s, d;
  describe(s, cfg);
  describe(d, def);
  size_t w = 0;
  for (auto& f : s.fields()) w = std::max(w, f.key.size());
  std::ostringstream out;
  for (size_t i = 0; i < s.fields().size(); ++i) {
    auto& f = s.fields()[i];
    if (!shown(cfg, f.key)) continue;
    std::string v = f.get();
    bool changed = v != d.fields()[i].get();
    out << "  " << f.key << std::string(w - f.key.size() + 2, ' ') << (changed ? "* " : "  ") << v << "\n";
  }
  return out.str();
}

namespace {

// A parsed structured value as JSON: maps, lists, and scalars typed as numbers where they read so.
nlohmann::ordered_json yaml_to_json(const YAML::Node& n) {
  if (n.IsSequence()) {
    auto out = nlohmann::ordered_json::array();
    for (const auto& x : n) out.push_back(yaml_to_json(x));
    return out;
  }
  if (n.IsMap()) {
    auto out = nlohmann::ordered_json::object();
    for (auto it = n.begin(); it != n.end(); ++it) out[it->first.as<std::string>()] = yaml_to_json(it->second);
    return out;
  }
  const std::string s = n.IsScalar() ? n.Scalar() : "";
  char* end = nullptr;
  const double d = std::strtod(s.c_str(), &end);
  if (!s.empty() && *end == '\0' && n.Tag() != "!") return d;
  return s;
}

}  // namespace

std::string to_json(const ExperimentConfig& cfg_in) {
  ExperimentConfig cfg = cfg_in;
  Schema s;
  describe(s, cfg);
  nlohmann::ordered_json out = nlohmann::ordered_json::object();
  for (auto& f : s.fields()) {
    if (!shown(cfg, f.key)) continue;
    auto dot = f.key.find('.');
    auto& sec = out[f.key.substr(0, dot)];
    const std::string leaf = f.key.substr(dot + 1), text = f.get();
    switch (f.type) {
      case 'i': sec[leaf] = text == "auto" ? nlohmann::ordered_json("auto") : nlohmann::ordered_json(std::stoll(text)); break;
      case 'n': sec[leaf] = std::strtod(text.c_str(), nullptr); break;
      case 'b': sec[leaf] = text == "true"; break;
      case 'y': sec[leaf] = yaml_to_json(YAML::Load(text)); break;
      default: sec[leaf] = YAML::Load(text).as<std::string>(""); break;
    }
  }
  return out.dump();
}

std::vector<KeyInfo> key_infos() {
  ExperimentConfig def;
  Schema s;
  describe(s, def);
  std::vector<KeyInfo> out;
  for (auto& f : s.fields()) out.push_back({f.key, f.get(), f.allowed, f.doc});
  return out;
}

std::string describe_keys() {
  const auto keys = key_infos();
  // Columns as wide as their widest cell, the default and allowed ones at most 32 (a wider cell,
  // e.g. a long default, pushes the rest of its row).
  size_t wk = 3, wd = 7, wa = 7;
  for (const auto& k : keys) {
    wk = std::max(wk, k.key.size());
    wd = std::max(wd, std::min<size_t>(k.default_value.size(), 32));
    wa = std::max(wa, std::min<size_t>(k.allowed.size(), 32));
  }
  auto cell = [](const std::string& v, size_t w) { return v + std::string(v.size() < w ? w - v.size() + 2 : 2, ' '); };
  std::string out = cell("KEY", wk) + cell("DEFAULT", wd) + cell("ALLOWED", wa) + "DESCRIPTION\n";
  for (const auto& k : keys) out += cell(k.key, wk) + cell(k.default_value, wd) + cell(k.allowed, wa) + k.doc + "\n";
  return out;
}

std::vector<std::string> config_keys() {
  ExperimentConfig cfg;
  Schema s;
  describe(s, cfg);
  std::vector<std::string> keys;
  for (auto& f : s.fields()) keys.push_back(f.key);
  return keys;
}

}  // namespace lm
