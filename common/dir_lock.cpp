// Directory locks (see dir_lock.h).
#include "common/dir_lock.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/errors.h"

namespace lm {
namespace {

// The pid of the lock's holder: the kernel's answer (F_GETLK), else what the holder wrote.
std::string lock_holder(int fd) {
  struct flock fl {};
  fl.l_type = F_WRLCK;
  fl.l_whence = SEEK_SET;
  if (::fcntl(fd, F_GETLK, &fl) == 0 && fl.l_type != F_UNLCK && fl.l_pid > 0) return std::to_string(fl.l_pid);
  char buf[32] = {0};
  const ssize_t n = ::pread(fd, buf, sizeof buf - 1, 0);
  std::string pid = n > 0 ? std::string(buf, static_cast<size_t>(n)) : "?";
  pid.erase(pid.find_last_not_of("\n ") + 1);
  return pid.empty() ? "?" : pid;
}

}  // namespace

DirLock::DirLock(const std::string& dir, const std::string& name, const std::string& who) : path_(dir + "/" + name) {
  fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) throw Error(path_ + ": cannot open lock file (" + std::strerror(errno) + ")");
  struct flock fl {};
  fl.l_type = F_WRLCK;
  fl.l_whence = SEEK_SET;  // l_start = l_len = 0: the whole file
  if (::fcntl(fd_, F_SETLK, &fl) != 0) {
    const int e = errno;
    const std::string holder = (e == EACCES || e == EAGAIN) ? lock_holder(fd_) : "";
    ::close(fd_);
    fd_ = -1;
    if (holder.empty()) throw Error(path_ + ": cannot lock (" + std::strerror(e) + ")");
    throw UsageError(dir + " is in use by " + who + " (pid " + holder + ", lock " + path_ +
                     "); wait for it to finish or stop it");
  }
  const std::string pid = std::to_string(::getpid()) + "\n";
  if (::ftruncate(fd_, 0) == 0 && ::pwrite(fd_, pid.data(), pid.size(), 0) < 0) { /* informational only */ }
}

DirLock::~DirLock() {
  if (fd_ >= 0) ::close(fd_);
}

}  // namespace lm
