// The training log's windows (see train_log.h).
#include "trainer/telemetry/train_log.h"

#include <cmath>

namespace lm {

void TrainLog::add(const Step& s) {
  z_loss_ += std::isfinite(s.z_loss) ? s.z_loss : 0;
  loss_ += std::isfinite(s.loss) ? s.loss : 0, time_ += s.seconds, wait_ += s.wait_ms, tokens_ += s.targets;
  pad_ += s.pad, inputs_ += s.inputs, flops_ += s.flops, ++steps_;
  run_pad_ += s.pad, run_inputs_ += s.inputs;
  if (s.timed) timed_tokens_ += s.targets, timed_s_ += s.seconds;
}

TrainLog::Window TrainLog::close() {
  const double n = static_cast<double>(steps_);
  Window w;
  w.loss = loss_ / n, w.z_loss = z_loss_ / n, w.tokens_per_s = tokens_ / time_, w.step_ms = 1e3 * time_ / n;
  w.wait_ms = wait_ / n, w.wait_pct = 100.0 * wait_ / 1e3 / time_;
  w.padding_pct = inputs_ > 0 ? 100.0 * pad_ / inputs_ : 0.0;
  w.flops_per_s = flops_ / time_;
  if (first_loss_ < 0) first_loss_ = w.loss;
  last_loss_ = w.loss;
  loss_ = z_loss_ = time_ = wait_ = tokens_ = pad_ = inputs_ = flops_ = 0;
  steps_ = 0;
  return w;
}

ComponentState TrainLog::state() const {
  ComponentState st;
  st.values = {{"loss", loss_}, {"time", time_}, {"wait", wait_}, {"tokens", tokens_}, {"pad", pad_},
               {"inputs", inputs_}, {"steps", steps_}, {"first_loss", first_loss_}, {"last_loss", last_loss_},
               {"timed_tokens", timed_tokens_}, {"timed_s", timed_s_}, {"run_pad", run_pad_},
               {"run_inputs", run_inputs_}, {"flops", flops_}};
  if (z_loss_ != 0) st.values["z_loss"] = z_loss_;  // optim.z_loss only: a run without it keeps its state's bytes
  return st;
}

void TrainLog::load_state(const ComponentState* in) {
  const ComponentState& st = *in;
  const auto& j = st.values;
  loss_ = j.at("loss"), time_ = j.at("time"), wait_ = j.at("wait"), tokens_ = j.at("tokens");
  pad_ = j.at("pad"), inputs_ = j.at("inputs"), steps_ = j.at("steps"), first_loss_ = j.at("first_loss");
  last_loss_ = j.at("last_loss"), timed_tokens_ = j.at("timed_tokens"), timed_s_ = j.at("timed_s");
  run_pad_ = j.at("run_pad"), run_inputs_ = j.at("run_inputs"), flops_ = j.value("flops", 0.0);
  z_loss_ = j.value("z_loss", 0.0);
}

}  // namespace lm
