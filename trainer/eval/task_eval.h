// Downstream evaluation in the loop (eval.tasks): multiple-choice tasks in the layout of
// lm-evaluation-harness and HellaSwag, one JSONL line per example:
//   {"context": "...", "choices": ["...", "..."], "label": i}
// (other fields are ignored). Each choice is scored by the model's log-likelihood given the context:
// the tokens [EOS] + context + choice (EOS starts a document, as in training), cut from the left to
// model.seq_len + 1 when longer (counted per task and logged), and the sum of log p of the choice's
// tokens (those left after a cut). acc: the choice with the highest sum is the label; acc_norm: the
// same with each sum divided by the choice's length in bytes (lm-eval's acc_norm). Ties go to the
// first choice. Examples are split over the ranks (example i on rank i % world), the counts summed
// with one all-reduce; the choices are batched (train.micro_batch_size rows, padded to the longest),
// in eval mode, under autocast with train.dtype=bf16. The ranks run the same number of forwards
// (EvalRuntime, evaluate.h: a parallelism that keeps the weights in parts gathers them inside).
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "data/loader/loader.h"
#include "data/tokenizer/tokenizer.h"
#include "models/lm.h"
#include "run/config/eval_config.h"
#include "trainer/eval/evaluate.h"
#include "trainer/telemetry/task_score.h"

namespace lm {

class Comm;

// One example of a multiple-choice file.
struct McExample {
  std::string context;
  std::vector<std::string> choices;
  int64_t label = 0;
};
// Reads a multiple-choice JSONL file (blank lines skipped). Throws DataError (exit 2) with one line
// naming FILE:LINE and why: not JSON, not an object, a missing or mistyped field, no choices, an
// empty choice, a label out of range; "FILE: ..." when it cannot be read or holds no example.
std::vector<McExample> read_mc_file(const std::string& path);

// One choice as the model reads it: tokens = [EOS] + context + choice, at most seq_len + 1 of them
// (inputs tokens[:-1], targets tokens[1:]); the last `scored` targets are the choice's.
struct ChoiceRow {
  std::vector<int64_t> tokens;
  int64_t scored = 0;
};
// *cut: whether the row was cut from the left to seq_len + 1 tokens.
ChoiceRow make_choice_row(const data::Tokenizer& tok, const std::string& context, const std::string& choice,
                          int64_t seq_len, bool* cut);
// Sum of log p(target) over each row's scored targets, in double; rows in batches of batch_rows,
// padded on the right to the batch's longest with pad_id (causal: padding changes nothing before it).
// forwards: run at least this many forwards, the ones past the rows on one pad token, their output
// dropped (lockstep: every rank runs as many as the rank with the most batches).
std::vector<double> score_choice_rows(LM& model, const std::vector<ChoiceRow>& rows, int64_t batch_rows,
                                      int64_t pad_id, const torch::Device& device, bool bf16, int64_t forwards = 0);

// The run's tokenizer (TrainData::tokenizer(): bytes, or the sentencepiece model of the data),
// through the plugin (load_tokenizer_isolated): what the tasks are tokenized with.
std::unique_ptr<data::Tokenizer> load_run_tokenizer(const data::TrainData& data);

// What the task evaluator needs of the run besides its eval: section (evaluate.h; batch_rows: choices
// per forward).
using TaskRuntime = EvalRuntime;

class TaskEvaluator {
 public:
  // Reads every eval.tasks file (a bad one: DataError naming FILE:LINE, exit 2) and tokenizes its
  // examples with `tok` (logging, on rank 0, each task's size and how many were cut); nullptr when
  // eval.tasks is empty.
  static std::unique_ptr<TaskEvaluator> create(const EvalConfig& cfg, const data::Tokenizer& tok, const TaskRuntime& rt);
  // Every task's score, the same on every rank (eval mode during the pass, train mode after). With
  // `comm`, each rank scores its examples and the counts are summed.
  std::vector<TaskScore> score(LM& model, Comm* comm);

 private:
  struct Example {
    size_t first_row = 0;             // its choices: rows [first_row, first_row + bytes.size())
    std::vector<int64_t> bytes;       // each choice's length in bytes
    int64_t label = 0;
  };
  struct Task {
    std::string name;
    int64_t examples = 0, truncated = 0;
    std::vector<Example> mine;        // this rank's examples
    std::vector<ChoiceRow> rows;      // their choices, in order
    int64_t forwards = 0;             // the most batches any rank scores: every rank runs as many
  };
  explicit TaskEvaluator(TaskRuntime rt, int64_t pad_id) : rt_(std::move(rt)), pad_id_(pad_id) {}
  TaskRuntime rt_;
  int64_t pad_id_;
  std::vector<Task> tasks_;
};

}  // namespace lm
