// Caching CPU allocator (see host_allocator.h).
#include "trainer/runtime/host_allocator.h"

#include <c10/core/CPUAllocator.h>

#include <sys/mman.h>

#include <cstdlib>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "common/torch/compat.h"

namespace lm {
namespace {

// Blocks of 2 MB and more are 2 MB-aligned and asked to be transparent huge pages: fewer TLB misses
// in the big matmuls.
void* allocate_block(size_t size) {
  constexpr size_t kHuge = size_t{2} << 20;
  void* p = nullptr;
  if (::posix_memalign(&p, size >= kHuge ? kHuge : 64, size) != 0 || !p)
    throw c10::Error({__func__, __FILE__, static_cast<uint32_t>(__LINE__)}, "out of memory allocating " + std::to_string(size) + " bytes");
  if (size >= kHuge) ::madvise(p, size, MADV_HUGEPAGE);
  return p;
}

class CachingHostAllocator final : public c10::Allocator {
 public:
  explicit CachingHostAllocator(size_t max_cached) : max_cached_(max_cached) {}

  c10::DataPtr allocate(size_t n) LM_ALLOCATOR_ALLOCATE_CONST override {
    if (n < kMinCachedBytes) return c10::GetDefaultCPUAllocator()->allocate(n);
    const size_t size = (n + 4095) & ~size_t{4095};
    void* ptr = nullptr;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = free_.find(size);
      if (it != free_.end() && !it->second.empty()) {
        ptr = it->second.back();
        it->second.pop_back();
        cached_ -= size;
        ++hits_;
      } else {
        ++misses_;
      }
    }
    if (!ptr) ptr = allocate_block(size);
    {
      std::lock_guard<std::mutex> lock(mu_);
      live_[ptr] = size;
    }
    return {ptr, ptr, &CachingHostAllocator::release, c10::Device(c10::DeviceType::CPU)};
  }

  // The context is the data pointer (LibTorch 2.x's raw_allocate/raw_deallocate, used by its bf16
  // CPU matmuls for scratch space, require it and a raw deleter); small blocks are the default
  // allocator's, whose context is its data pointer too.
  c10::DeleterFnPtr raw_deleter() const override { return &CachingHostAllocator::release; }
  LM_ALLOCATOR_COPY_DATA

  HostAllocatorStats stats() const {
    std::lock_guard<std::mutex> lock(mu_);
    return {hits_, misses_, cached_};
  }

 private:
  static void release(void* ptr) {
    auto* self = instance();
    size_t size = 0;
    {
      std::lock_guard<std::mutex> lock(self->mu_);
      auto it = self->live_.find(ptr);
      if (it != self->live_.end()) size = it->second, self->live_.erase(it);
    }
    if (size == 0) return c10::GetDefaultCPUAllocator()->raw_deleter()(ptr);  // a small block
    self->put(ptr, size);
  }

  void put(void* ptr, size_t size) const {
    std::vector<void*> drop;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (cached_ + size > max_cached_) {  // over budget: give everything back to the system
        for (auto& [s, ptrs] : free_) drop.insert(drop.end(), ptrs.begin(), ptrs.end());
        free_.clear();
        cached_ = 0;
      }
      if (size <= max_cached_) {
        free_[size].push_back(ptr);
        cached_ += size;
        ptr = nullptr;
      }
    }
    for (void* p : drop) std::free(p);
    if (ptr) std::free(ptr);
  }

 public:
  static CachingHostAllocator*& instance() {
    static CachingHostAllocator* a = nullptr;
    return a;
  }

 private:
  const size_t max_cached_;
  mutable std::mutex mu_;
  mutable std::unordered_map<size_t, std::vector<void*>> free_;
  mutable std::unordered_map<void*, size_t> live_;  // handed out: pointer -> size class
  mutable size_t cached_ = 0;
  mutable uint64_t hits_ = 0, misses_ = 0;
};

}  // namespace

void install_caching_host_allocator(size_t max_cached_bytes) {
  static std::once_flag once;
  std::call_once(once, [&] {
    // Never destroyed: tensors may be freed during static destruction.
    CachingHostAllocator::instance() = new CachingHostAllocator(max_cached_bytes);
    c10::SetCPUAllocator(CachingHostAllocator::instance(), /*priority=*/100);
  });
}

HostAllocatorStats host_allocator_stats() {
  auto* a = CachingHostAllocator::instance();
  return a ? a->stats() : HostAllocatorStats{};
}

}  // namespace lm
