// Staging buffer and chunked copies of the async checkpoint (see staging.h).
#include "trainer/checkpoint/staging.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace lm {

void ChunkedCopy::add(void* dst, const void* src, size_t n) {
  for (size_t o = 0; o < n; o += kChunk)
    chunks_.push_back({static_cast<char*>(dst) + o, static_cast<const char*>(src) + o, std::min(kChunk, n - o)});
}

void ChunkedCopy::copy_some() {
  for (size_t i; (i = next_.fetch_add(1)) < chunks_.size();) {
    std::memcpy(chunks_[i].dst, chunks_[i].src, chunks_[i].n);
    if (copied_.fetch_add(1) + 1 == chunks_.size()) {
      std::lock_guard<std::mutex> lock(mu_);
      cv_.notify_all();
    }
  }
}

void ChunkedCopy::wait() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [this] { return done(); });
}

namespace {

constexpr int64_t kAlign = 4096;  // direct I/O: buffer addresses and file offsets
int64_t round_up(int64_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

}  // namespace

std::vector<files::FilePlan> StagingBuffer::stage(const TensorFiles& files,
                                                  const std::map<std::string, std::string>& metadata,
                                                  ChunkedCopy* copies, std::vector<torch::Tensor>* keep) {
  std::vector<SafetensorsLayout> layouts;
  int64_t total = kAlign;  // room to align the first image
  bool cuda = false;
  for (auto& [name, tensors] : files) {
    layouts.push_back(safetensors_layout(tensors, metadata));
    total += round_up(static_cast<int64_t>(layouts.back().size()));
    for (auto& [n, t] : layouts.back().tensors) cuda |= t.is_cuda();
  }
  if (!buffer_.defined() || buffer_.numel() < total || (cuda && !buffer_.is_pinned()))
    buffer_ = torch::empty({total}, torch::TensorOptions().dtype(torch::kUInt8).pinned_memory(cuda));
  keep->push_back(buffer_);
  char* base = reinterpret_cast<char*>(buffer_.data_ptr<uint8_t>());
  int64_t off = round_up(static_cast<int64_t>(reinterpret_cast<uintptr_t>(base))) -
                static_cast<int64_t>(reinterpret_cast<uintptr_t>(base));
  std::vector<files::FilePlan> plans;
  for (size_t i = 0; i < files.size(); ++i) {
    const SafetensorsLayout& l = layouts[i];
    std::memcpy(base + off, l.head.data(), l.head.size());
    int64_t at = off + static_cast<int64_t>(l.head.size());
    for (auto& [n, t] : l.tensors) {
      const int64_t bytes = t.numel() * t.element_size();
      if (bytes == 0) continue;
      if (t.is_cuda()) {
        buffer_.narrow(0, at, bytes).copy_(t.reshape({-1}).view(torch::kUInt8));
      } else {
        copies->add(base + at, t.data_ptr(), static_cast<size_t>(bytes));
        keep->push_back(t);
      }
      at += bytes;
    }
    plans.push_back({files[i].first, "", {{base + off, static_cast<size_t>(l.size())}}});
    off += round_up(static_cast<int64_t>(l.size()));
  }
  return plans;
}

}  // namespace lm
