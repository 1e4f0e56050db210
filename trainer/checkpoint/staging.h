// The async checkpoint's snapshot (writer.h): the tensor files laid out as file images in a
// host buffer kept between saves, each image 4096-byte aligned so that the writer sends it to the
// disk with direct I/O straight from there (files.h, try_write_plan: no bounce copy, no page cache),
// and the host state copied into the images in chunks that the writer thread and the training
// thread both claim (whichever gets there first; see CheckpointWriter::wait_snapshot).
#pragma once

#include <torch/torch.h>

#include <atomic>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/files.h"
#include "common/parallel.h"
#include "trainer/checkpoint/safetensors.h"

namespace lm {

// Copies of host memory cut into chunks of 4 MB that any thread may claim. add() them all before
// the first copy_some().
class ChunkedCopy {
 public:
  void add(void* dst, const void* src, size_t n);
  // Claims and copies chunks until none is left to claim.
  void copy_some();
  // Returns once every chunk is copied (by any thread).
  void wait();
  bool done() const { return copied_.load() == chunks_.size(); }

 private:
  struct Chunk {
    void* dst;
    const void* src;
    size_t n;
  };
  static constexpr size_t kChunk = size_t{4} << 20;
  std::vector<Chunk> chunks_;
  std::atomic<size_t> next_{0};    // the next chunk to claim
  std::atomic<size_t> copied_{0};  // chunks finished
  std::mutex mu_;
  std::condition_variable cv_;  // notified when the last chunk is finished
};

using TensorFiles = std::vector<std::pair<std::string, NamedTensors>>;  // file name -> its tensors

// The host buffer the images live in: grown when too small, pinned when it receives device
// tensors, kept for the next save.
class StagingBuffer {
 public:
  StagingBuffer();  // defined where Prefault is complete (staging.cpp)
  StagingBuffer(const StagingBuffer&) = delete;
  StagingBuffer& operator=(const StagingBuffer&) = delete;
  ~StagingBuffer();
  // Allocates the buffer for `files` now, so that the first save does not. Host memory: its pages
  // are faulted in on a background thread (idle priority, yielding); the first copy into 1.5 GB of
  // fresh memory otherwise takes the page faults (the kernel zeroing every page) inside the steps
  // that run while it is made. A save (stage()) or the destructor that comes before it finished
  // stops it, raised to normal priority for its last piece (a thread at idle priority beside busy
  // processes would otherwise take minutes to get there); the copy faults in the rest. Device tensors: pinned memory, resident once allocated (here, on
  // the calling thread). Nothing to do when the buffer is big enough.
  void prepare(const TensorFiles& files, const std::map<std::string, std::string>& metadata);
  // `files` as safetensors images in this buffer, each a plan of one span. The heads and the
  // device tensors are copied now (device to pinned host, synchronous); host tensors are added to
  // *copies, and *keep holds their memory and the buffer's until the plans are written. Waits for
  // prepare()'s thread first.
  std::vector<files::FilePlan> stage(const TensorFiles& files, const std::map<std::string, std::string>& metadata,
                                     ChunkedCopy* copies, std::vector<torch::Tensor>* keep);

 private:
  bool allocate(int64_t bytes, bool pinned);  // a new buffer when too small or not pinned as needed
  void join_prefault();

  torch::Tensor buffer_;  // uint8
  struct Prefault;  // prepare()'s thread, touching one byte per page
  std::unique_ptr<Prefault> prefault_;
};

}  // namespace lm
