// parallel_for: the one small thread pool for CPU work split into independent items (prep's
// tokenizing rounds, the raw-text index build).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <exception>
#include <functional>
#include <thread>
#include <vector>

namespace lm {

// Runs work(i) for i < n on up to `threads` threads (the caller's included); rethrows the first
// exception after every thread stopped.
inline void parallel_for(size_t n, int threads, const std::function<void(size_t)>& work) {
  std::atomic<size_t> next{0};
  const size_t t_count = std::max<size_t>(1, std::min(n, static_cast<size_t>(std::max(threads, 1))));
  std::vector<std::exception_ptr> errors(t_count);
  auto loop = [&](size_t t) {
    try {
      for (size_t i; (i = next++) < n;) work(i);
    } catch (...) {
      errors[t] = std::current_exception();
      next = n;
    }
  };
  std::vector<std::thread> pool;
  for (size_t t = 1; t < t_count; ++t) pool.emplace_back(loop, t);
  loop(0);
  for (auto& th : pool) th.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

}  // namespace lm
