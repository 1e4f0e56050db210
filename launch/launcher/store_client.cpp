// The client of the rendezvous store (see store.h): blocking calls, each bounded by the timeout,
// over a non-blocking socket; the 2.x dialect of c10d's TCPStore protocol.
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>

#include "common/errors.h"
#include "common/log.h"
#include "launch/launcher/store.h"
#include "launch/launcher/store_wire.h"

namespace lm::launch {
namespace {

using namespace store_wire;

const char* const kKeyPrefix = "/";  // c10d::TCPStore's own prefix of every key

// Milliseconds left until `deadline` (0 when past), for poll().
int millis_left(StoreClock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - StoreClock::now()).count();
  return static_cast<int>(std::max<int64_t>(0, std::min<int64_t>(left, 1 << 30)));
}

// Waits until `fd` is ready for `events`; false when `deadline` came first.
bool ready_by(int fd, short events, StoreClock::time_point deadline) {
  while (true) {
    pollfd p{fd, events, 0};
    int rc = ::poll(&p, 1, millis_left(deadline));
    if (rc > 0 || (rc < 0 && errno != EINTR)) return true;  // an error: the read or write that follows reports it
    if (rc == 0 && StoreClock::now() >= deadline) return false;  // a signal (EINTR, e.g. SIGCHLD) polls again
  }
}

// One connection attempt to every address of host:port (non-blocking, bounded by `deadline`).
// Returns the connected socket, or -1 with the reason in `why`.
int connect_once(const std::string& host, int port, StoreClock::time_point deadline, std::string& why) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res)) {
    why = ::gai_strerror(rc);
    return -1;
  }
  int fd = -1;
  for (addrinfo* ai = res; ai && fd < 0; ai = ai->ai_next) {
    fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) continue;
    int err = ::connect(fd, ai->ai_addr, ai->ai_addrlen) == 0 ? 0 : errno;
    if (err == EINPROGRESS) {
      socklen_t len = sizeof err;
      err = ready_by(fd, POLLOUT, deadline) ? 0 : ETIMEDOUT;
      if (!err) ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
    }
    if (err) {
      why = std::strerror(err);
      ::close(fd);
      fd = -1;
    }
  }
  ::freeaddrinfo(res);
  return fd;
}

}  // namespace

StoreClient::StoreClient(const std::string& host, int port, std::chrono::milliseconds timeout)
    : timeout_(timeout), where_(host + ":" + std::to_string(port)) {
  const auto deadline = StoreClock::now() + timeout;
  std::string why;
  while ((fd_ = connect_once(host, port, deadline, why)) < 0) {
    if (StoreClock::now() >= deadline)
      throw Error(strf("no store answered within %g s (%s)", timeout.count() / 1000.0, why.c_str()));
    std::this_thread::sleep_for(std::min(std::chrono::milliseconds(100), timeout));
  }
  set_nodelay(fd_);
  std::string q = query(Op::kValidate);  // no reply
  put<uint32_t>(q, kValidateMagic);
  const uint32_t nonce = static_cast<uint32_t>(::getpid());
  q += query(Op::kPing);
  put<uint32_t>(q, nonce);
  try {
    send_all(q);
    if (recv_value<uint32_t>() != nonce) throw Error(strf("%s answered PING wrongly: no store?", where_.c_str()));
  } catch (...) {
    ::close(fd_);  // the destructor does not run
    throw;
  }
}

StoreClient::~StoreClient() {
  if (fd_ >= 0) ::close(fd_);
}

void StoreClient::set(const std::string& key, const std::string& value) {
  std::string q = query(Op::kSet);
  put_bytes(q, kKeyPrefix + key);
  put_bytes(q, value);
  send_all(q);
}

// As c10d's get(): WAIT for the key (CANCEL_WAIT when the time is up), then GET.
std::string StoreClient::get(const std::string& key) {
  std::string q = query(Op::kWait);
  put<uint64_t>(q, 1);
  put_bytes(q, kKeyPrefix + key);
  send_all(q);
  if (!ready_by(fd_, POLLIN, StoreClock::now() + timeout_)) {
    send_all(query(Op::kCancelWait));
    if (recv_value<uint8_t>() == kStopWaiting) recv_value<uint8_t>();  // it came just before the cancel
    throw Error(strf("timed out after %g s waiting for key '%s'", timeout_.count() / 1000.0, key.c_str()));
  }
  if (recv_value<uint8_t>() != kStopWaiting) throw Error(strf("%s: unexpected reply to WAIT", where_.c_str()));
  q = query(Op::kGet);
  put_bytes(q, kKeyPrefix + key);
  send_all(q);
  return recv_exact(static_cast<size_t>(recv_value<uint64_t>()));
}

int64_t StoreClient::add(const std::string& key, int64_t delta) {
  std::string q = query(Op::kAdd);
  put_bytes(q, kKeyPrefix + key);
  put<int64_t>(q, delta);
  send_all(q);
  return recv_value<int64_t>();
}

bool StoreClient::check(const std::vector<std::string>& keys) {
  std::string q = query(Op::kCheck);
  put<uint64_t>(q, keys.size());
  for (auto& k : keys) put_bytes(q, kKeyPrefix + k);
  send_all(q);
  uint8_t r = recv_value<uint8_t>();
  if (r != kReady && r != kNotReady) throw Error(strf("%s: unexpected reply to CHECK", where_.c_str()));
  return r == kReady;
}

void StoreClient::send_all(const std::string& bytes) {
  const auto deadline = StoreClock::now() + timeout_;
  for (size_t done = 0; done < bytes.size();) {
    ssize_t n = ::send(fd_, bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL);
    if (n >= 0) {
      done += static_cast<size_t>(n);
      continue;
    }
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK)
      throw Error(strf("the store at %s closed the connection (%s)", where_.c_str(), std::strerror(errno)));
    if (!ready_by(fd_, POLLOUT, deadline))
      throw Error(strf("the store at %s took no data for %g s", where_.c_str(), timeout_.count() / 1000.0));
  }
}

std::string StoreClient::recv_exact(size_t n) {
  const auto deadline = StoreClock::now() + timeout_;
  std::string out(n, '\0');
  for (size_t done = 0; done < n;) {
    ssize_t got = ::recv(fd_, &out[done], n - done, 0);
    if (got > 0) {
      done += static_cast<size_t>(got);
      continue;
    }
    if (got < 0 && errno == EINTR) continue;
    if (got == 0 || (errno != EAGAIN && errno != EWOULDBLOCK))
      throw Error(strf("the store at %s closed the connection", where_.c_str()));
    if (!ready_by(fd_, POLLIN, deadline))
      throw Error(strf("no answer from the store at %s within %g s", where_.c_str(), timeout_.count() / 1000.0));
  }
  return out;
}

template <typename T>
T StoreClient::recv_value() {
  std::string b = recv_exact(sizeof(T));
  T v;
  std::memcpy(&v, b.data(), sizeof v);
  return v;
}

}  // namespace lm::launch
