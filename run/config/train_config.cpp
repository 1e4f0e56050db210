// The run: and train: sections' keys (see train_config.h): each one's type, allowed values and its
// one description, printed by `trainer --keys` and docs/config.md.
#include "run/config/train_config.h"

#include "common/config/schema.h"

namespace lm {

void describe_run(config_schema::Schema& s, RunConfig& r) {
  s.text("run.dir", &r.dir, "run directory: config, metrics, logs, checkpoints", "non-empty path");
  s.integer("run.seed", &r.seed, "seed of model init, dropout and data order", 0);
  s.boolean("run.skip_memory_check", &r.skip_memory_check, "start even when the memory estimate exceeds what is "
            "available");
}

void describe_train(config_schema::Schema& s, TrainConfig& t) {
  s.integer("train.max_steps", &t.max_steps, "optimizer steps", 1);
  s.integer("train.micro_batch_size", &t.micro_batch_size, "sequences per micro-batch (one forward/backward)", 1);
  s.integer("train.grad_accum", &t.grad_accum, "micro-batches per optimizer step", 1);
  s.integer("train.threads", &t.threads, "math threads of each rank (OpenBLAS's pool where LibTorch uses OpenBLAS, else LibTorch intra-op); 0 = 1 on CPU, LibTorch's default on CUDA", 0, 1024);
  s.choice("train.device", &t.device, "compute device; auto = cuda when available, else cpu", {"auto", "cpu", "cuda"});
  s.choice("train.dtype", &t.dtype, "compute dtype; bf16 = autocast with fp32 master weights and optimizer state "
           "(CPU: LibTorch >= 2.4)", {"fp32", "bf16"});
  s.choice("train.fused_loss", &t.fused_loss, "the LM head and the cross-entropy as one function: the logits "
           "never in fp32, the softmax overwritten by its gradient; auto = on CUDA; the validation loss stays the "
           "plain path", {"auto", "on", "off"});
  s.boolean("train.bf16_residual", &t.bf16_residual, "the residual stream and the norms in bf16 (llm.c's "
            "layout) instead of fp32; needs train.dtype=bf16");
  s.choice("train.activation_checkpointing", &t.activation_checkpointing, "block = each transformer block "
           "keeps only its input (B,T,C) for the backward, which runs the block's forward again (the same dropout and "
           "autocast): the activations of one block instead of all, for one more forward per step; none = all kept",
           {"none", "block"});
  s.number("train.ema_decay", &t.ema_decay, "EMA of the weights, updated every step; 0 = off", 0, false, 1, true);
}

}  // namespace lm
