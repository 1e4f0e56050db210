// A caching allocator for LibTorch's CPU tensors.
//
// A training step allocates and frees the same large activations every step. glibc serves blocks
// above its mmap threshold with mmap/munmap, so each step page-faults and zero-fills them again
// (measured: ~11% of a CPU step at the benchmark shape). This allocator keeps freed blocks of at
// least kMinCachedBytes in per-size free lists and hands them out again, as PyTorch's CUDA caching
// allocator does for device memory. Smaller requests go to LibTorch's default allocator. Blocks of
// 2 MB and more are transparent-huge-page backed (madvise): fewer TLB misses in the big matmuls.
// Thread-safe. Cached memory is bounded by `max_cached_bytes`; past it the free lists are emptied.
#pragma once

#include <cstddef>
#include <cstdint>

namespace lm {

constexpr size_t kMinCachedBytes = 64 * 1024;

// Installs the allocator as LibTorch's CPU allocator. Idempotent; call before creating tensors
// that should use it (earlier tensors keep their own deleters and are freed correctly).
void install_caching_host_allocator(size_t max_cached_bytes = size_t{4} << 30);

struct HostAllocatorStats {
  uint64_t hits = 0, misses = 0;  // cached-size requests served from / not from the free lists
  size_t cached_bytes = 0;        // bytes currently held in the free lists
};
HostAllocatorStats host_allocator_stats();

}  // namespace lm
