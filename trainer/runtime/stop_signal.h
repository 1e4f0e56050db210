// SIGTERM / SIGINT for the trainer, by phase.
//
// Start-up (config to the end of the Trainer's constructor: data, run directory, rendezvous, resume
// loading, model): nothing needs saving yet, so the first signal ends the process at once, wherever
// it blocks, with one line on stderr and exit status 128+signal (every file is written atomically:
// nothing is left half-written; a crash-style "*.tmp.<pid>" file at most).
// Training (from training_started() on): the first signal only sets the flag that requested()
// returns; the loop checkpoints and exits 0 after the current step (an evaluation or a save in
// progress finishes first; after the last step the run just completes).
// In every phase a second signal aborts at once (the default action).
#pragma once

namespace lm::stop_signal {

// Installs the handlers in start-up mode. Call once, before any start-up work.
void install();
// Switches to training mode: later signals checkpoint and stop instead of exiting at once.
void training_started();
// The first stop signal received in training mode (SIGTERM or SIGINT), 0 when none.
int requested();

}  // namespace lm::stop_signal
