// load_tokenizer_isolated(): loads lm_tokenizer.so with its own symbol scope (see tokenizer.h).
#include <dlfcn.h>
#include <limits.h>
#include <unistd.h>

#include <filesystem>

#include "data/tokenizer/tokenizer.h"
#include "common/errors.h"

namespace lm::data {

std::unique_ptr<Tokenizer> load_tokenizer_isolated(const std::string& what) {
  char exe[PATH_MAX];
  ssize_t n = ::readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n <= 0) throw Error("cannot locate the running executable (/proc/self/exe)");
  exe[n] = '\0';
  const std::string plugin = (std::filesystem::path(exe).parent_path() / "lm_tokenizer.so").string();
  // RTLD_LOCAL keeps sentencepiece's protobuf out of the global scope; RTLD_DEEPBIND makes the
  // plugin resolve its own symbols before the process's (LibTorch's libprotobuf).
  static void* handle = ::dlopen(plugin.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
  if (!handle) throw Error(plugin + ": cannot load the tokenizer plugin (" + ::dlerror() + ")");
  using LoadFn = Tokenizer* (*)(const char*, char*, size_t);
  auto load = reinterpret_cast<LoadFn>(::dlsym(handle, "lm_tokenizer_load"));
  if (!load) throw Error(plugin + ": no lm_tokenizer_load entry point");
  char err[1024] = {0};
  Tokenizer* t = load(what.c_str(), err, sizeof err);
  if (!t) throw DataError(err);
  return std::unique_ptr<Tokenizer>(t);
}

}  // namespace lm::data
