// The checkpoint: section's keys (see checkpoint_config.h): each one's type, allowed values and its
// one description, printed by `trainer --keys` and docs/config.md. Torch-free (lm_run).
#include "run/config/checkpoint_config.h"

#include "common/config/schema.h"

namespace lm {

void describe_checkpoint(config_schema::Schema& s, CheckpointConfig& ck) {
  s.integer_or_auto("checkpoint.every_steps", &ck.every_steps, "save every N steps; 0 = only at the end; "
                    "auto = the Young/Daly interval from checkpoint.mtbf_hours", 0);
  s.number("checkpoint.mtbf_hours", &ck.mtbf_hours, "every_steps auto: hours between failures of one node "
           "(the job's MTBF is this / nodes)", 0, true);
  s.integer("checkpoint.keep_last", &ck.keep_last, "newest checkpoints kept; 0 = all", 0);
  s.integer("checkpoint.keep_every", &ck.keep_every, "checkpoints at multiples of this step are never "
            "deleted; 0 = none", 0);
  s.text("checkpoint.resume", &ck.resume, "auto = the newest valid checkpoint in run.dir, none = fresh "
         "start, or a checkpoint directory", "auto|none|path");
  s.boolean("checkpoint.force", &ck.force, "resume even when the model architecture or data version differ");
  s.boolean("checkpoint.async", &ck.async, "snapshot, then write checkpoints in the background while "
            "training continues");
  s.number("checkpoint.write_pace", &ck.write_pace, "async saves: the share of the checkpoint interval (in "
           "step time) the disk writes are spread over, so that they take less CPU from the steps; 0 = as fast as "
           "the disk takes them", 0, false, 1, false);
  s.choice("checkpoint.on_error", &ck.on_error, "a failed save: stop = exit 1, continue = warn and keep "
           "training", {"stop", "continue"});
  s.number("checkpoint.commit_timeout_s", &ck.commit_timeout_s, "seconds rank 0 waits for the other ranks' "
           "checkpoint files", 0, true);
}

}  // namespace lm
