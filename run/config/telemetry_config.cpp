// The log: and anomaly: sections' keys (see telemetry_config.h): each one's type, allowed values and
// its one description, printed by `trainer --keys` and docs/config.md. Torch-free (lm_run).
#include "run/config/telemetry_config.h"

#include "common/config/schema.h"

namespace lm {

void describe_log(config_schema::Schema& s, LogConfig& l) {
  s.integer("log.every_steps", &l.every_steps, "a console line, metrics.jsonl and TensorBoard record every N steps", 1);
  s.number("log.peak_tflops", &l.peak_tflops, "per-device peak TFLOP/s for MFU; 0 = the datasheet peak of a "
           "known GPU (H100, H200, A100; other GPUs: no MFU), on CPU an SGEMM peak measured during the run", 0, false);
  s.number("log.long_window_s", &l.long_window_s, "seconds per long-window aggregate (mean/min/max tokens/s and MFU)",
           0, true);
  s.boolean("log.tensorboard", &l.tensorboard, "write a TensorBoard event file in run.dir");
  s.text("log.profile_steps", &l.profile_steps,
         "A-B: a Chrome trace of steps A..B and its top ops or GPU kernels (top.json) in RUN_DIR/profile/; empty = off",
         "A-B (1 <= A <= B) or empty");
}

void describe_anomaly(config_schema::Schema& s, AnomalyConfig& a) {
  s.number("anomaly.spike_factor", &a.spike_factor, "a loss above this times its running mean is a spike; 0 = off",
           0, false);
  s.integer("anomaly.window", &a.window, "steps in the loss's running mean", 1);
  s.integer("anomaly.warmup_steps", &a.warmup_steps, "no spike checks before this step (non-finite values always "
            "count)", 0);
  s.choice("anomaly.action", &a.action, "on an anomaly: continue, skip (no weight update) or stop (checkpoint, "
           "exit 1)", {"continue", "skip", "stop"});
  s.integer("anomaly.max_dumps", &a.max_dumps, "anomaly directories written at most", 0);
}

}  // namespace lm
