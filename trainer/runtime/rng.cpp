// Random streams of one rank (see rng.h).
#include "trainer/runtime/rng.h"

#include <string>

#include "common/log.h"
#include "trainer/runtime/device.h"

namespace lm {
namespace {

std::string to_hex(const torch::Tensor& bytes) {
  auto c = bytes.contiguous();
  std::string out;
  const auto* p = c.data_ptr<uint8_t>();
  for (int64_t i = 0; i < c.numel(); ++i) out += strf("%02x", p[i]);
  return out;
}

torch::Tensor from_hex(const std::string& hex) {
  auto t = torch::empty({static_cast<int64_t>(hex.size() / 2)}, torch::kUInt8);
  auto* p = t.data_ptr<uint8_t>();
  for (size_t i = 0; i + 1 < hex.size(); i += 2) p[i / 2] = static_cast<uint8_t>(std::stoul(hex.substr(i, 2), nullptr, 16));
  return t;
}

}  // namespace

void RngStreams::seed_shared(uint64_t seed) const { torch::manual_seed(seed); }

void RngStreams::seed_rank(uint64_t seed, int rank) const {
  torch::manual_seed(seed ^ (0x9E3779B97F4A7C15ull * static_cast<uint64_t>(rank + 1)));
}

ComponentState RngStreams::state() const {
  ComponentState st;
  st.values = {{"cpu", to_hex(at::detail::getDefaultCPUGenerator().get_state())}};
  if (auto cuda = cuda_rng_state(device_); cuda.defined()) st.values["cuda"] = to_hex(cuda);
  return st;
}

void RngStreams::load_state(const ComponentState* in) {
  if (!in) {
    log::warn("rng: the checkpoint has no state for this rank (world size changed): the global data cursor is "
              "rank 0's, dropout draws start anew");
    return;
  }
  const ComponentState& st = *in;
  at::Generator gen = at::detail::getDefaultCPUGenerator();  // a handle on the shared generator
  gen.set_state(from_hex(st.values.at("cpu").get<std::string>()));
  if (st.values.contains("cuda")) set_cuda_rng_state(device_, from_hex(st.values.at("cuda").get<std::string>()));
}

}  // namespace lm
