// safetensors reader and writer (see safetensors.h).
#include "trainer/checkpoint/safetensors.h"

#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <memory>

#include "common/errors.h"
#include "common/checksum.h"
#include "common/files.h"

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

std::string safetensors_head(std::vector<TensorSpec>* specs, const std::map<std::string, std::string>& metadata,
                             uint64_t* data_bytes) {
  std::sort(specs->begin(), specs->end(), [](auto& a, auto& b) { return a.name < b.name; });
  nlohmann::ordered_json header;
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t off = 0;
  for (const auto& s : *specs) {
    const uint64_t nbytes = s.bytes();
    header[s.name] = {{"dtype", dtype_name(s.dtype)}, {"shape", s.shape}, {"data_offsets", {off, off + nbytes}}};
    off += nbytes;
  }
  std::string h = header.dump();
  h.append((8 - h.size() % 8) % 8, ' ');
  const uint64_t hlen = h.size();
  std::string head(reinterpret_cast<const char*>(&hlen), 8);  // little-endian host
  head += h;
  if (data_bytes) *data_bytes = off;
  return head;
}

SafetensorsLayout safetensors_layout(const NamedTensors& tensors_in, const std::map<std::string, std::string>& metadata) {
  SafetensorsLayout out;
  out.tensors = tensors_in;
  std::sort(out.tensors.begin(), out.tensors.end(), [](auto& a, auto& b) { return a.first < b.first; });
  std::vector<TensorSpec> specs;
  for (auto& [tname, t] : out.tensors) {
    t = t.detach().contiguous();
    specs.push_back(TensorSpec::of(tname, t));
  }
  out.head = safetensors_head(&specs, metadata, &out.data_bytes);
  return out;
}

SafetensorsWriter::SafetensorsWriter(const std::string& path, std::vector<TensorSpec> specs,
                                     const std::map<std::string, std::string>& metadata)
    : path_(path), file_(path) {
  file_.write(safetensors_head(&specs, metadata, nullptr));
  specs_ = std::move(specs);
}

void SafetensorsWriter::write(const torch::Tensor& t) {
  if (next_ >= specs_.size()) throw Error(path_ + ": a tensor written past the last of the header");
  const auto& s = specs_[next_];
  if (t.scalar_type() != s.dtype || t.sizes().vec() != s.shape)
    throw Error(path_ + ": tensor '" + s.name + "' written with another dtype or shape than its header's");
  const auto c = t.detach().to(torch::kCPU).contiguous();
  file_.write(c.data_ptr(), s.bytes());
  ++next_;
}

void SafetensorsWriter::commit() {
  if (next_ != specs_.size()) throw Error(path_ + ": committed with tensors of its header unwritten");
  file_.commit();
}

SafetensorsPlan plan_safetensors(const std::string& name, const NamedTensors& tensors,
                                 const std::map<std::string, std::string>& metadata) {
  SafetensorsLayout layout = safetensors_layout(tensors, metadata);
  SafetensorsPlan out;
  out.plan.name = name;
  out.plan.head = std::move(layout.head);
  for (auto& [tname, t] : layout.tensors) {
    auto c = t.to(torch::kCPU);
    out.plan.spans.push_back({c.data_ptr(), static_cast<size_t>(c.numel() * c.element_size())});
    out.keep.push_back(c);
  }
  return out;
}

void save_safetensors(const std::string& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata) {
  auto sp = plan_safetensors("", tensors, metadata);
  files::AtomicFile f(path);
  f.write(sp.plan.head);
  for (auto& span : sp.plan.spans) f.write(span.data, span.size);
  f.commit();
}

// One tensor of a safetensors header: its byte range in the data section, its dtype and shape, and
// (once allocated) its memory. (Not in the anonymous namespace: SafetensorsReader::Impl holds them.)
struct SafetensorsHeaderEntry {
  uint64_t begin, end;
  std::string name;
  torch::ScalarType dtype;
  std::vector<int64_t> shape;
  torch::Tensor t;
  void allocate() { t = torch::empty(shape, torch::TensorOptions().dtype(dtype)); }
};

namespace {

using HeaderEntry = SafetensorsHeaderEntry;

[[noreturn]] void bad_file(const std::string& path, const std::string& why) {
  throw CheckpointError(path + ": not a valid safetensors file (" + why + ")");
}

// The header's tensors (not allocated) and, into *metadata, its "__metadata__".
std::vector<HeaderEntry> parse_header(const std::string& path, const std::string& head, uint64_t data_size,
                                      std::map<std::string, std::string>* metadata) {
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(head);
  } catch (const std::exception& e) {
    bad_file(path, std::string("bad header JSON: ") + e.what());
  }
  if (!header.is_object()) bad_file(path, "the header is not a JSON object");
  std::vector<HeaderEntry> entries;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (!it->is_object()) bad_file(path, "__metadata__ is not an object");
      for (auto m = it->begin(); m != it->end(); ++m) {
        if (!m->is_string()) bad_file(path, "__metadata__." + m.key() + " is not a string");  // found by tests/fuzz
        if (metadata) (*metadata)[m.key()] = m->get<std::string>();
      }
      continue;
    }
    try {
      auto dt = it->at("dtype").get<std::string>();
      // Integers only, in range: a float or an unsigned above 2^63 would convert with undefined
      // behaviour (found by tests/fuzz, fuzz_safetensors).
      auto ints = [&](const char* field, bool non_negative) {
        const auto& a = it->at(field);
        if (!a.is_array()) bad_file(path, "tensor " + it.key() + ": " + field + " is not an array");
        std::vector<int64_t> v;
        for (const auto& d : a) {
          if (!d.is_number_integer() || (d.is_number_unsigned() && d.get<uint64_t>() > uint64_t{INT64_MAX}) ||
              (non_negative && d.get<int64_t>() < 0))
            bad_file(path, "tensor " + it.key() + ": " + field + " holds " + d.dump() + ", not an integer in range");
          v.push_back(d.get<int64_t>());
        }
        return v;
      };
      const std::vector<int64_t> shape = ints("shape", true);
      std::vector<uint64_t> offs;
      for (int64_t o : ints("data_offsets", true)) offs.push_back(static_cast<uint64_t>(o));
      auto found = std::find_if(dtype_names().begin(), dtype_names().end(), [&](auto& p) { return p.second == dt; });
      if (found == dtype_names().end()) bad_file(path, "tensor " + it.key() + ": unknown dtype " + dt);
      // The shape must fit the bytes its offsets name inside the file before anything is allocated.
      uint64_t bytes = c10::elementSize(found->first);
      for (int64_t d : shape) {
        if (d > 0 && bytes > data_size / static_cast<uint64_t>(d) + 1) bytes = data_size + 1;  // past the file: refused below
        else bytes *= static_cast<uint64_t>(d);
      }
      if (offs.size() != 2 || offs[1] < offs[0] || offs[1] > data_size || offs[1] - offs[0] != bytes)
        bad_file(path, "tensor " + it.key() + ": bad data_offsets");
      entries.push_back({offs[0], offs[1], it.key(), found->first, shape, {}});
    } catch (const nlohmann::json::exception& e) {
      bad_file(path, "tensor " + it.key() + ": " + e.what());
    }
  }
  return entries;
}

// Reads the data section straight into the tensors, in file order, hashing every byte (gaps too:
// not written by us, but legal to meet).
void read_data(int fd, const std::string& path, uint64_t data_start, uint64_t data_size,
               std::vector<HeaderEntry>& entries, Xxh64& hash) {
  std::sort(entries.begin(), entries.end(), [](auto& a, auto& b) { return a.begin < b.begin; });
  uint64_t pos = 0;
  std::string gap;
  auto skip_to = [&](uint64_t to) {
    gap.resize(to - pos);
    files::pread_all(fd, path, data_start + pos, gap.data(), gap.size());
    hash.update(gap.data(), gap.size());
  };
  for (auto& e : entries) {
    if (e.begin < pos) bad_file(path, "tensor " + e.name + ": overlapping data_offsets");
    if (e.begin > pos) skip_to(e.begin);
    e.allocate();
    files::pread_all(fd, path, data_start + e.begin, e.t.data_ptr(), e.end - e.begin);
    hash.update(e.t.data_ptr(), e.end - e.begin);
    pos = e.end;
  }
  if (pos < data_size) skip_to(data_size);
}

}  // namespace

NamedTensors load_safetensors(const std::string& path, std::map<std::string, std::string>* metadata,
                              const std::string& expect_xxh64) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw CheckpointError(path + ": cannot open (" + std::string(std::strerror(errno)) + ")");
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat sb;
  if (::fstat(fd, &sb) != 0) throw CheckpointError(path + ": cannot stat");
  const uint64_t file_size = static_cast<uint64_t>(sb.st_size);
  try {
    if (file_size < 8) bad_file(path, "too short");
    uint64_t hlen;
    files::pread_all(fd, path, 0, &hlen, 8);
    if (hlen > file_size - 8) bad_file(path, "header length beyond end of file");
    std::string head(hlen, '\0');
    files::pread_all(fd, path, 8, head.data(), hlen);
    Xxh64 hash;
    hash.update(&hlen, 8);
    hash.update(head.data(), head.size());
    const uint64_t data_start = 8 + hlen, data_size = file_size - data_start;
    auto entries = parse_header(path, head, data_size, metadata);
    read_data(fd, path, data_start, data_size, entries, hash);
    if (!expect_xxh64.empty() && hex64(hash.digest()) != expect_xxh64) throw CheckpointError(path + ": checksum mismatch");
    NamedTensors out;
    for (auto& e : entries) out.emplace_back(e.name, e.t);
    std::sort(out.begin(), out.end(), [](auto& a, auto& b) { return a.first < b.first; });
    return out;
  } catch (const DataError& e) {
    throw CheckpointError(e.what());
  }
}

NamedTensors module_tensors(const torch::nn::Module& m) {
  NamedTensors out;
  for (auto& p : m.named_parameters()) out.emplace_back(p.key(), p.value());
  for (auto& b : m.named_buffers()) out.emplace_back(b.key(), b.value());
  return out;
}

struct SafetensorsReader::Impl {
  int fd = -1;
  std::string path;
  uint64_t data_start = 0;
  std::map<std::string, SafetensorsHeaderEntry> entries;
  ~Impl() {
    if (fd >= 0) ::close(fd);
  }
};

SafetensorsReader::SafetensorsReader(const std::string& path) : impl_(std::make_unique<Impl>()) {
  impl_->path = path;
  impl_->fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (impl_->fd < 0) throw CheckpointError(path + ": cannot open (" + std::string(std::strerror(errno)) + ")");
  struct stat sb;
  if (::fstat(impl_->fd, &sb) != 0) throw CheckpointError(path + ": cannot stat");
  const uint64_t file_size = static_cast<uint64_t>(sb.st_size);
  try {
    if (file_size < 8) bad_file(path, "too short");
    uint64_t hlen;
    files::pread_all(impl_->fd, path, 0, &hlen, 8);
    if (hlen > file_size - 8) bad_file(path, "header length beyond end of file");
    std::string head(hlen, '\0');
    files::pread_all(impl_->fd, path, 8, head.data(), hlen);
    impl_->data_start = 8 + hlen;
    for (auto& e : parse_header(path, head, file_size - impl_->data_start, &metadata_)) {
      names_.push_back(e.name);
      impl_->entries.emplace(e.name, std::move(e));
    }
  } catch (const DataError& e) {
    throw CheckpointError(e.what());
  }
  std::sort(names_.begin(), names_.end());
}

SafetensorsReader::~SafetensorsReader() = default;

TensorSpec SafetensorsReader::spec(const std::string& name) const {
  auto it = impl_->entries.find(name);
  if (it == impl_->entries.end()) throw CheckpointError(impl_->path + ": no tensor '" + name + "'");
  return {name, it->second.dtype, it->second.shape};
}

torch::Tensor SafetensorsReader::read(const std::string& name) const {
  auto it = impl_->entries.find(name);
  if (it == impl_->entries.end()) throw CheckpointError(impl_->path + ": no tensor '" + name + "'");
  SafetensorsHeaderEntry e = it->second;
  e.allocate();
  try {
    files::pread_all(impl_->fd, impl_->path, impl_->data_start + e.begin, e.t.data_ptr(), e.end - e.begin);
  } catch (const DataError& err) {
    throw CheckpointError(err.what());
  }
  return e.t;
}

void check_tensor_shape(const std::string& what, const std::string& name, const torch::Tensor& t, at::IntArrayRef want) {
  if (t.sizes() != want)
    throw CheckpointError(what + ": tensor '" + name + "' has shape " + c10::str(t.sizes()) + ", the model expects " +
                          c10::str(want));
}

void load_into_module(torch::nn::Module& m, const NamedTensors& tensors, const std::string& what) {
  std::map<std::string, torch::Tensor> by_name(tensors.begin(), tensors.end());
  torch::NoGradGuard ng;
  size_t used = 0;
  for (auto& [name, dst] : module_tensors(m)) {
    auto it = by_name.find(name);
    if (it == by_name.end()) throw CheckpointError(what + ": missing tensor '" + name + "'");
    check_tensor_shape(what, name, it->second, dst.sizes());
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
