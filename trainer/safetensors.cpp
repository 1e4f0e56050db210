// safetensors reader and writer (see safetensors.h).
#include "trainer/safetensors.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>

#include "trainer/errors.h"
#include "trainer/fileio.h"

namespace lm {
namespace {

const std::vector<std::pair<torch::ScalarType, std::string>>& dtype_names() {
  static const std::vector<std::pair<torch::ScalarType, std::string>> k = {
      {torch::kFloat, "F32"}, {torch::kDouble, "F64"}, {torch::kHalf, "F16"},
      {torch::kBFloat16, "BF16"}, {torch::kLong, "I64"}, {torch::kInt, "I32"},
      {torch::kShort, "I16"}, {torch::kChar, "I8"}, {torch::kByte, "U8"}, {torch::kBool, "BOOL"}};
  return k;
}

std::string dtype_name(torch::ScalarType t) {
  for (auto& [s, n] : dtype_names())
    if (s == t) return n;
  throw Error(std::string("safetensors: unsupported dtype ") + c10::toString(t));
}

}  // namespace

SafetensorsPlan plan_safetensors(const std::string& name, const NamedTensors& tensors_in,
                                 const std::map<std::string, std::string>& metadata) {
  NamedTensors tensors = tensors_in;
  std::sort(tensors.begin(), tensors.end(), [](auto& a, auto& b) { return a.first < b.first; });
  nlohmann::ordered_json header;
  if (!metadata.empty()) header["__metadata__"] = metadata;
  SafetensorsPlan out;
  out.plan.name = name;
  uint64_t off = 0;
  for (auto& [tname, t] : tensors) {
    auto c = t.detach().to(torch::kCPU).contiguous();
    uint64_t nbytes = c.numel() * c.element_size();
    header[tname] = {{"dtype", dtype_name(c.scalar_type())},
                     {"shape", c.sizes().vec()},
                     {"data_offsets", {off, off + nbytes}}};
    off += nbytes;
    out.plan.spans.push_back({c.data_ptr(), nbytes});
    out.keep.push_back(c);
  }
  std::string h = header.dump();
  h.append((8 - h.size() % 8) % 8, ' ');
  uint64_t hlen = h.size();
  out.plan.head.assign(reinterpret_cast<const char*>(&hlen), 8);  // little-endian host
  out.plan.head += h;
  return out;
}

void save_safetensors(const std::string& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata) {
  auto sp = plan_safetensors("", tensors, metadata);
  fs::AtomicFile f(path);
  f.write(sp.plan.head);
  for (auto& span : sp.plan.spans) f.write(span.data, span.size);
  f.commit();
}

NamedTensors load_safetensors(const std::string& path, std::map<std::string, std::string>* metadata) {
  std::string bytes;
  try {
    bytes = fs::read_file(path);
  } catch (const DataError& e) {
    throw CheckpointError(e.what());
  }
  auto fail = [&](const std::string& why) { throw CheckpointError(path + ": not a valid safetensors file (" + why + ")"); };
  if (bytes.size() < 8) fail("too short");
  uint64_t hlen;
  std::memcpy(&hlen, bytes.data(), 8);
  if (hlen > bytes.size() - 8) fail("header length beyond end of file");
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(bytes.substr(8, hlen));
  } catch (const std::exception& e) {
    fail(std::string("bad header JSON: ") + e.what());
  }
  const uint64_t data_start = 8 + hlen, data_size = bytes.size() - data_start;
  NamedTensors out;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (metadata)
        for (auto m = it->begin(); m != it->end(); ++m) (*metadata)[m.key()] = m->get<std::string>();
      continue;
    }
    try {
      auto dt = it->at("dtype").get<std::string>();
      auto shape = it->at("shape").get<std::vector<int64_t>>();
      auto offs = it->at("data_offsets").get<std::vector<uint64_t>>();
      auto found = std::find_if(dtype_names().begin(), dtype_names().end(), [&](auto& p) { return p.second == dt; });
      if (found == dtype_names().end()) fail("tensor " + it.key() + ": unknown dtype " + dt);
      auto t = torch::empty(shape, torch::TensorOptions().dtype(found->first));
      uint64_t nbytes = t.numel() * t.element_size();
      if (offs.size() != 2 || offs[1] < offs[0] || offs[1] > data_size || offs[1] - offs[0] != nbytes)
        fail("tensor " + it.key() + ": bad data_offsets");
      std::memcpy(t.data_ptr(), bytes.data() + data_start + offs[0], nbytes);
      out.emplace_back(it.key(), t);
    } catch (const nlohmann::json::exception& e) {
      fail("tensor " + it.key() + ": " + e.what());
    }
  }
  std::sort(out.begin(), out.end(), [](auto& a, auto& b) { return a.first < b.first; });
  return out;
}

NamedTensors module_tensors(const torch::nn::Module& m) {
  NamedTensors out;
  for (auto& p : m.named_parameters()) out.emplace_back(p.key(), p.value());
  for (auto& b : m.named_buffers()) out.emplace_back(b.key(), b.value());
  return out;
}

void load_into_module(torch::nn::Module& m, const NamedTensors& tensors, const std::string& what) {
  std::map<std::string, torch::Tensor> by_name(tensors.begin(), tensors.end());
  torch::NoGradGuard ng;
  size_t used = 0;
  for (auto& [name, dst] : module_tensors(m)) {
    auto it = by_name.find(name);
    if (it == by_name.end()) throw CheckpointError(what + ": missing tensor '" + name + "'");
    if (it->second.sizes() != dst.sizes())
      throw CheckpointError(what + ": tensor '" + name + "' has shape " + c10::str(it->second.sizes()) +
                            ", the model expects " + c10::str(dst.sizes()));
    dst.copy_(it->second);
    ++used;
  }
  if (used != by_name.size()) {
    std::set<std::string> names;
    for (auto& [n, t] : module_tensors(m)) names.insert(n);
    for (auto& [n, t] : by_name)
      if (!names.count(n)) throw CheckpointError(what + ": unexpected tensor '" + n + "'");
  }
}

}  // namespace lm
