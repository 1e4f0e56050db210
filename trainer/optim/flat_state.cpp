// Whole and sliced state of buffers laid out as the flat parameters (see flat_state.h).
#include "trainer/optim/flat_state.h"

#include <algorithm>
#include <cstdio>
#include <map>

#include "common/errors.h"
#include "common/log.h"

namespace lm {

NamedTensors flat_slices(const FlatParams& flat, const std::vector<FlatRange>& ranges, const torch::Tensor& values,
                         const std::string& prefix, bool indexed) {
  NamedTensors out;
  int64_t at = 0;  // where the range starts in `values`
  for (const auto& r : ranges) {
    if (indexed) at = r.offset;
    for (const auto& e : flat.entries()) {
      const int64_t a = std::max(r.offset, e.offset), b = std::min(r.offset + r.numel, e.offset + e.numel);
      if (a >= b) continue;
      out.emplace_back(prefix + e.name + strf("[%lld:%lld]", (long long)(a - e.offset), (long long)(b - e.offset)),
                       values.narrow(0, at + (a - r.offset), b - a));
    }
    at += r.numel;
  }
  return out;
}

bool split_slice_name(const std::string& name, std::string* param, int64_t* a, int64_t* b) {
  *param = name, *a = 0, *b = -1;
  const auto open = name.rfind('[');
  if (open == std::string::npos || name.back() != ']') return true;
  long long x = 0, y = 0;
  char tail = 0;
  if (std::sscanf(name.c_str() + open, "[%lld:%lld%c", &x, &y, &tail) != 3 || tail != ']') return false;
  param->resize(open);
  *a = x, *b = y;
  return true;
}

bool parse_flat_slice(const FlatParams& flat, const std::string& name, const torch::Tensor& t,
                      const std::string& prefix, const std::string& what, FlatSlice* out) {
  if (name.compare(0, prefix.size(), prefix) != 0) return false;
  std::string param;
  int64_t a = 0, b = -1;
  if (!split_slice_name(name.substr(prefix.size()), &param, &a, &b))
    throw CheckpointError(what + ": tensor '" + name + "' has a malformed slice (expected <param>[a:b])");
  const FlatParams::Entry* entry = nullptr;
  for (const auto& e : flat.entries())
    if (e.name == param) entry = &e;
  if (!entry) throw CheckpointError(what + ": tensor '" + name + "' names no parameter of this model");
  if (b < 0) b = entry->numel;
  if (a < 0 || a > b || b > entry->numel || t.numel() != b - a)
    throw CheckpointError(strf("%s: tensor '%s' (%lld values) does not fit parameter '%s' (%lld values)", what.c_str(),
                               name.c_str(), (long long)t.numel(), entry->name.c_str(), (long long)entry->numel));
  *out = {entry, a, b};
  return true;
}

void copy_flat_slice(const std::vector<FlatRange>& ranges, torch::Tensor& packed, const FlatSlice& s,
                     const torch::Tensor& t, std::vector<int64_t>* covered, bool indexed) {
  torch::NoGradGuard ng;
  const auto values = t.reshape({-1});
  const int64_t begin = s.offset(), end = begin + s.numel();
  int64_t at = 0;
  for (size_t i = 0; i < ranges.size(); ++i) {
    const auto& r = ranges[i];
    if (indexed) at = r.offset;
    const int64_t a = std::max(r.offset, begin), b = std::min(r.offset + r.numel, end);
    if (a < b) {
      packed.narrow(0, at + (a - r.offset), b - a).copy_(values.narrow(0, a - begin, b - a));
      (*covered)[i] += b - a;
    }
    at += r.numel;
  }
}

void check_flat_coverage(const std::vector<FlatRange>& ranges, const std::vector<int64_t>& covered, int copies,
                         const std::string& what) {
  for (size_t i = 0; i < ranges.size(); ++i)
    if (covered[i] != copies * ranges[i].numel)
      throw CheckpointError(strf("optimizer state: the %s of flat values %lld..%lld got %lld values from the "
                                 "checkpoint, %lld expected (a part missing, or parts overlapping)",
                                 what.c_str(), (long long)ranges[i].offset,
                                 (long long)(ranges[i].offset + ranges[i].numel - 1), (long long)covered[i],
                                 (long long)(copies * ranges[i].numel)));
}

void load_flat_values(const FlatParams& flat, torch::Tensor& values, const ComponentState& st, const std::string& what,
                      const std::vector<FlatRange>* only, bool packed) {
  const std::vector<FlatRange> ranges = only ? *only : std::vector<FlatRange>{{0, flat.numel()}};
  std::vector<int64_t> covered(ranges.size(), 0);
  auto take = [&](const NamedTensors& ts) {
    for (const auto& [name, t] : ts) {
      FlatSlice s;
      parse_flat_slice(flat, name, t, "", what, &s);
      copy_flat_slice(ranges, values, s, t, &covered, /*indexed=*/!packed);
    }
  };
  take(st.tensors);
  for (const auto& read_part : st.shards) take(read_part());  // one part in memory at a time
  int64_t got = 0, want = 0;
  for (size_t i = 0; i < ranges.size(); ++i) got += covered[i], want += ranges[i].numel;
  if (got != want)
    throw CheckpointError(strf("%s: %lld values from the checkpoint for %lld weights (a part missing, or parts "
                               "overlapping)", what.c_str(), (long long)got, (long long)want));
}

}  // namespace lm
