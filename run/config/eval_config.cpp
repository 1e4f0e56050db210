// The eval: section's keys (see eval_config.h): each one's type, allowed values and its one
// description, printed by `trainer --keys` and docs/config.md. Torch-free (lm_run).
#include "run/config/eval_config.h"

#include "common/config/schema.h"
#include "common/config/values.h"

namespace lm {
namespace eval_keys {

using namespace config_values;

// eval.tasks: [{name, path, kind}]; a name [A-Za-z0-9_.-]+ and unique, a path, kind multiple_choice.
void parse_tasks(const YAML::Node& n, std::vector<TaskConfig>* out) {
  out->clear();
  const YAML::Node& list = list_of(n);
  for (size_t i = 0; i < list.size(); ++i) {
    TaskConfig t;
    each_key(i, list[i], {"name", "path", "kind"}, [&](const std::string& k, const YAML::Node& v) {
      if (k == "name") t.name = scalar_of(v);
      if (k == "path") t.path = scalar_of(v);
      if (k == "kind") t.kind = scalar_of(v);
    });
    const std::string where = entry_where(i, list[i]);
    if (t.name.empty() || t.path.empty()) bad(where + ": needs a name and a path");
    if (t.name.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-") != std::string::npos)
      bad(where + ": name '" + t.name + "': letters, digits, '_', '.' and '-' only (it names metrics)");
    if (t.kind != "multiple_choice") bad(where + ": kind '" + t.kind + "': the one kind is multiple_choice");
    for (const auto& o : *out)
      if (o.name == t.name) bad(where + ": a second task named '" + t.name + "'");
    out->push_back(t);
  }
}

std::string print_tasks(const std::vector<TaskConfig>& v) {
  std::string out;
  for (const auto& t : v)
    out += (out.empty() ? "{" : ", {") + std::string("name: ") + quote(t.name) + ", path: " + quote(t.path) +
           ", kind: " + quote(t.kind) + "}";
  return "[" + out + "]";
}

}  // namespace eval_keys

void describe_eval(config_schema::Schema& s, EvalConfig& e) {
  using eval_keys::parse_tasks;
  using eval_keys::print_tasks;
  s.integer("eval.every_steps", &e.every_steps, "validation loss (and eval.tasks) every N steps and at the end; 0 = only at the end", 0);
  s.integer("eval.batches", &e.batches, "validation micro-batches per evaluation; 0 = no validation", 0);
  EvalConfig* ep = &e;
  s.structured("eval.tasks", "downstream tasks scored at the start, every eval.every_steps and at the end: "
               "[{name, path, kind: multiple_choice}], each a JSONL file of {\"context\": text, \"choices\": [text, "
               "...], \"label\": i}; acc = the choice of highest log-likelihood given the context is the label, "
               "acc_norm = the same per byte of the choice (lm-eval's acc_norm); context + choice cut from the left "
               "to model.seq_len; empty = none", "list of maps",
               [ep](const YAML::Node& n) { parse_tasks(n, &ep->tasks); }, [ep] { return print_tasks(ep->tasks); });
}

}  // namespace lm
