// The server of the rendezvous store (see store.h for the protocol): a poll() loop on its own
// thread over non-blocking sockets, parsing each connection's queries from the bytes that have
// arrived so far (a query split over several reads waits for the rest). The client:
// store_client.cpp.
#include "launch/launcher/store.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>
#include <map>
#include <stdexcept>
#include <thread>
#include <unordered_map>

#include "common/errors.h"
#include "common/log.h"
#include "launch/launcher/store_wire.h"

namespace lm::launch {
namespace {

using namespace store_wire;

constexpr uint8_t kLastV2Op = static_cast<uint8_t>(Op::kQueueLen);
constexpr size_t kMaxKeyLen = 64 * 1024;  // longer: a garbled stream
constexpr size_t kMaxValueLen = size_t{256} << 20;
constexpr uint64_t kMaxKeyCount = 128 * 1024;  // as c10d's libuv server

// The query type of byte `type` in dialect `d` (kInvalid: refused).
Op op_of(Dialect d, uint8_t type) {
  static const Op v1[] = {Op::kSet,    Op::kCompareSet, Op::kGet,      Op::kAdd,
                          Op::kCheck,  Op::kWait,       Op::kNumKeys,  Op::kInvalid /* WATCH_KEY */,
                          Op::kDelete, Op::kAppend,     Op::kMultiGet, Op::kMultiSet,
                          Op::kCancelWait};
  if (d == Dialect::kV1) return type < sizeof v1 / sizeof v1[0] ? v1[type] : Op::kInvalid;
  return type >= 1 && type <= kLastV2Op ? static_cast<Op>(type) : Op::kInvalid;  // VALIDATE only first
}

struct ProtocolError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// One query as parsed from a connection's bytes.
struct Query {
  Op op = Op::kInvalid;
  std::vector<std::string> keys;
  std::vector<std::string> values;  // SET, APPEND, QUEUE_PUSH: 1; COMPARE_SET: expected, desired; MULTI_SET: 1 per key
  int64_t delta = 0;                // ADD
  uint32_t nonce = 0;               // PING
};

// Reads from the bytes received so far; each read returns false when they end first.
struct Reader {
  const std::string& buf;
  size_t pos = 0;

  template <typename T>
  bool pod(T& v) {
    if (buf.size() - pos < sizeof v) return false;
    std::memcpy(&v, buf.data() + pos, sizeof v);
    pos += sizeof v;
    return true;
  }
  bool bytes(std::vector<std::string>& to, size_t max) {
    uint64_t n = 0;
    if (!pod(n)) return false;
    if (n > max) throw ProtocolError(strf("a length of %llu bytes", static_cast<unsigned long long>(n)));
    if (buf.size() - pos < n) return false;
    to.emplace_back(buf, pos, n);
    pos += n;
    return true;
  }
  bool key(Query& q) { return bytes(q.keys, kMaxKeyLen); }
  bool value(Query& q) { return bytes(q.values, kMaxValueLen); }
  bool count(uint64_t& n) {
    if (!pod(n)) return false;
    if (n > kMaxKeyCount) throw ProtocolError(strf("a count of %llu keys", static_cast<unsigned long long>(n)));
    return true;
  }
};

// Parses the arguments of q.op; false when they have not all arrived yet.
bool parse_args(Reader& in, Query& q) {
  uint64_t n = 0;
  switch (q.op) {
    case Op::kSet: case Op::kAppend: case Op::kQueuePush: return in.key(q) && in.value(q);
    case Op::kCompareSet: return in.key(q) && in.value(q) && in.value(q);
    case Op::kGet: case Op::kDelete: case Op::kQueuePop: case Op::kQueueLen: return in.key(q);
    case Op::kAdd: return in.key(q) && in.pod(q.delta);
    case Op::kPing: return in.pod(q.nonce);
    case Op::kCheck: case Op::kWait: case Op::kMultiGet:
      if (!in.count(n)) return false;
      for (uint64_t i = 0; i < n; ++i)
        if (!in.key(q)) return false;
      return true;
    case Op::kMultiSet:
      if (!in.count(n)) return false;
      for (uint64_t i = 0; i < n; ++i)
        if (!in.key(q) || !in.value(q)) return false;
      return true;
    default: return true;  // GETNUMKEYS, CANCEL_WAIT
  }
}

std::string peer_name(int fd) {
  sockaddr_storage a{};
  socklen_t len = sizeof a;
  char host[INET6_ADDRSTRLEN] = "?";
  int port = 0;
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
    if (a.ss_family == AF_INET6) {
      auto* a6 = reinterpret_cast<sockaddr_in6*>(&a);
      if (IN6_IS_ADDR_V4MAPPED(&a6->sin6_addr))  // an IPv4 peer of the dual-stack socket
        ::inet_ntop(AF_INET, &a6->sin6_addr.s6_addr[12], host, sizeof host);
      else
        ::inet_ntop(AF_INET6, &a6->sin6_addr, host, sizeof host);
      port = ntohs(a6->sin6_port);
    } else if (a.ss_family == AF_INET) {
      auto* a4 = reinterpret_cast<sockaddr_in*>(&a);
      ::inet_ntop(AF_INET, &a4->sin_addr, host, sizeof host);
      port = ntohs(a4->sin_port);
    }
  }
  return strf("%s:%d", host, port);
}

// A listening socket on `port` of every interface: IPv6 accepting IPv4 too, else IPv4 alone.
int listen_any(int port) {
  int err = 0;
  for (int family : {AF_INET6, AF_INET}) {
    int fd = ::socket(family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) {
      err = errno;
      continue;
    }
    int one = 1, zero = 0;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_storage a{};
    socklen_t len;
    if (family == AF_INET6) {
      ::setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
      auto* a6 = reinterpret_cast<sockaddr_in6*>(&a);
      a6->sin6_family = AF_INET6;
      a6->sin6_addr = in6addr_any;
      a6->sin6_port = htons(static_cast<uint16_t>(port));
      len = sizeof *a6;
    } else {
      auto* a4 = reinterpret_cast<sockaddr_in*>(&a);
      a4->sin_family = AF_INET;
      a4->sin_addr.s_addr = htonl(INADDR_ANY);
      a4->sin_port = htons(static_cast<uint16_t>(port));
      len = sizeof *a4;
    }
    if (::bind(fd, reinterpret_cast<sockaddr*>(&a), len) == 0 && ::listen(fd, SOMAXCONN) == 0) return fd;
    err = errno;
    ::close(fd);
    if (err == EADDRINUSE || err == EACCES) break;  // IPv4 would say the same
  }
  throw Error(strf("cannot listen on port %d: %s", port, std::strerror(err)));
}

}  // namespace

// ---- the server ---------------------------------------------------------------------------------

struct StoreServer::Impl {
  struct Conn {
    std::string peer;  // "addr:port", for the log
    Dialect dialect = Dialect::kUnknown;
    std::string in, out;  // bytes received and not yet parsed; replies not yet sent
    size_t awaited = 0;   // keys its pending WAIT still needs (0: no WAIT pending)
    bool closing = false;
  };

  int listen_fd = -1;
  int stop_pipe[2] = {-1, -1};  // a byte on stop_pipe[1] stops the thread
  std::thread thread;
  std::map<int, Conn> conns;  // by fd
  std::unordered_map<std::string, std::string> kv;
  std::unordered_map<std::string, std::deque<std::string>> queues;
  std::unordered_map<std::string, std::vector<int>> waiters;  // key -> connections whose WAIT needs it

  void run();
  void accept_all();
  void read_from(int fd, Conn& c);
  bool serve_one(int fd, Conn& c);
  void execute(int fd, Conn& c, Query& q);
  void close_finished();

  bool exists(const std::string& key) const {
    auto q = queues.find(key);
    return kv.count(key) || (q != queues.end() && !q->second.empty());
  }
  void set(const std::string& key, std::string value) {
    kv[key] = std::move(value);
    wake(key, false);
  }
  int64_t add(const std::string& key, int64_t delta);
  std::string compare_set(const Query& q);
  std::string queue_pop(const std::string& key);
  bool start_wait(int fd, Conn& c, const std::vector<std::string>& keys);
  void clear_wait(int fd, Conn& c);
  void wake(const std::string& key, bool just_one);
  void send(int fd, Conn& c, const std::string& bytes);
  void flush(int fd, Conn& c);
};

StoreServer::StoreServer(int port) : impl_(std::make_unique<Impl>()) {
  impl_->listen_fd = listen_any(port);
  sockaddr_storage a{};
  socklen_t len = sizeof a;
  ::getsockname(impl_->listen_fd, reinterpret_cast<sockaddr*>(&a), &len);
  port_ = ntohs(a.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&a)->sin6_port
                                        : reinterpret_cast<sockaddr_in*>(&a)->sin_port);
  if (::pipe2(impl_->stop_pipe, O_CLOEXEC) != 0) {
    ::close(impl_->listen_fd);
    throw Error(strf("pipe2: %s", std::strerror(errno)));
  }
  impl_->thread = std::thread([this] { impl_->run(); });
}

StoreServer::~StoreServer() {
  char b = 0;
  ssize_t ignored = ::write(impl_->stop_pipe[1], &b, 1);
  (void)ignored;
  impl_->thread.join();
  for (auto& [fd, c] : impl_->conns) ::close(fd);
  for (int fd : {impl_->listen_fd, impl_->stop_pipe[0], impl_->stop_pipe[1]}) ::close(fd);
}

void StoreServer::Impl::run() {
  std::vector<pollfd> fds;
  while (true) {
    fds.assign({{stop_pipe[0], POLLIN, 0}, {listen_fd, POLLIN, 0}});
    for (auto& [fd, c] : conns)
      fds.push_back({fd, static_cast<short>(POLLIN | (c.out.empty() ? 0 : POLLOUT)), 0});
    if (::poll(fds.data(), fds.size(), -1) < 0) {
      if (errno == EINTR) continue;
      log::error(strf("[launch] store: poll failed (%s); the store stops", std::strerror(errno)));
      for (auto& [fd, c] : conns) c.closing = true;  // its clients fail at once rather than time out
      close_finished();
      return;
    }
    if (fds[0].revents) return;
    if (fds[1].revents) accept_all();
    for (size_t i = 2; i < fds.size(); ++i) {
      if (!fds[i].revents) continue;
      Conn& c = conns.at(fds[i].fd);
      if (fds[i].revents & POLLOUT) flush(fds[i].fd, c);
      if (fds[i].revents & ~POLLOUT) read_from(fds[i].fd, c);
    }
    close_finished();
  }
}

void StoreServer::Impl::accept_all() {
  while (true) {
    int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK)
        log::warn(strf("[launch] store: accept failed: %s", std::strerror(errno)));
      return;
    }
    set_nodelay(fd);
    conns[fd].peer = peer_name(fd);
  }
}

// Reads what arrived and serves every whole query in it. A malformed or unknown query closes the
// connection with one log line (as c10d's servers close it).
void StoreServer::Impl::read_from(int fd, Conn& c) {
  char buf[65536];
  while (true) {
    ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n > 0) {
      c.in.append(buf, static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) c.closing = true;  // EOF or reset
    break;
  }
  try {
    while (serve_one(fd, c)) {
    }
  } catch (const std::exception& e) {
    log::warn(strf("[launch] store: closing the connection from %s: %s", c.peer.c_str(), e.what()));
    c.closing = true;
  }
}

// Serves one whole query from the front of c.in; false when it has not all arrived yet.
bool StoreServer::Impl::serve_one(int fd, Conn& c) {
  Reader in{c.in};
  if (c.dialect == Dialect::kUnknown) {
    uint8_t first = 0;
    uint32_t magic = 0;
    if (!in.pod(first) || (first == 0 && !in.pod(magic))) return false;
    if (first == 0 && magic == kValidateMagic) {  // a 2.x client's VALIDATE: no reply
      c.dialect = Dialect::kV2;
      c.in.erase(0, in.pos);
      return true;
    }
    c.dialect = Dialect::kV1;
    in.pos = 0;
  }
  uint8_t type = 0;
  if (!in.pod(type)) return false;
  Query q;
  q.op = op_of(c.dialect, type);
  if (q.op == Op::kInvalid)
    throw ProtocolError(strf("unknown query type %d (%s protocol)", type, c.dialect == Dialect::kV2 ? "2.x" : "1.x"));
  if (!parse_args(in, q)) return false;
  c.in.erase(0, in.pos);
  execute(fd, c, q);
  return true;
}

void StoreServer::Impl::execute(int fd, Conn& c, Query& q) {
  std::string r;
  const std::string* key = q.keys.empty() ? nullptr : &q.keys[0];
  switch (q.op) {
    case Op::kSet: set(*key, std::move(q.values[0])); break;
    case Op::kCompareSet: put_bytes(r, compare_set(q)); break;
    case Op::kGet: case Op::kMultiGet:
      for (auto& k : q.keys) {
        auto it = kv.find(k);
        put_bytes(r, it == kv.end() ? std::string() : it->second);
      }
      break;
    case Op::kAdd: put<int64_t>(r, add(*key, q.delta)); break;
    case Op::kCheck:
      put<uint8_t>(r, kReady);
      for (auto& k : q.keys)
        if (!exists(k)) r[0] = static_cast<char>(kNotReady);
      break;
    case Op::kWait:
      if (start_wait(fd, c, q.keys)) put<uint8_t>(r, kStopWaiting);
      break;
    case Op::kNumKeys: put<int64_t>(r, static_cast<int64_t>(kv.size())); break;
    case Op::kDelete: put<int64_t>(r, static_cast<int64_t>(kv.erase(*key))); break;
    case Op::kAppend:
      kv[*key] += q.values[0];
      wake(*key, false);
      break;
    case Op::kMultiSet:
      for (size_t i = 0; i < q.keys.size(); ++i) set(q.keys[i], std::move(q.values[i]));
      break;
    case Op::kCancelWait:
      clear_wait(fd, c);
      put<uint8_t>(r, kWaitCanceled);
      break;
    case Op::kPing: put<uint32_t>(r, q.nonce); break;
    case Op::kQueuePush:
      queues[*key].push_back(std::move(q.values[0]));
      wake(*key, true);
      break;
    case Op::kQueuePop: r = queue_pop(*key); break;
    case Op::kQueueLen: {
      auto it = queues.find(*key);
      put<int64_t>(r, it == queues.end() ? 0 : static_cast<int64_t>(it->second.size()));
      break;
    }
    default: break;
  }
  if (!r.empty()) send(fd, c, r);
}

// c10d's ADD: the value is decimal text (std::stoll, as c10d parses it); a missing key counts as 0.
int64_t StoreServer::Impl::add(const std::string& key, int64_t delta) {
  auto it = kv.find(key);
  if (it != kv.end()) {
    try {
      delta += std::stoll(it->second);
    } catch (const std::exception&) {
      throw ProtocolError("ADD to key '" + key + "', whose value is not an integer");
    }
  }
  set(key, std::to_string(delta));
  return delta;
}

// The value after the exchange; a missing key is created only when `expected` is empty.
std::string StoreServer::Impl::compare_set(const Query& q) {
  const std::string &key = q.keys[0], &expected = q.values[0], &desired = q.values[1];
  auto it = kv.find(key);
  if (it == kv.end()) {
    if (!expected.empty()) return expected;  // c10d's answer ("lying" about the missing key)
    set(key, desired);
    return desired;
  }
  if (it->second == expected) set(key, desired);
  return kv[key];
}

std::string StoreServer::Impl::queue_pop(const std::string& key) {
  std::string r;
  auto& q = queues[key];
  put<int64_t>(r, static_cast<int64_t>(q.size()));
  if (!q.empty()) {
    put_bytes(r, q.front());
    q.pop_front();
  }
  return r;
}

// Registers a WAIT (replacing the connection's previous one); true when every key exists already.
bool StoreServer::Impl::start_wait(int fd, Conn& c, const std::vector<std::string>& keys) {
  clear_wait(fd, c);
  for (auto& k : keys)
    if (!exists(k)) {
      waiters[k].push_back(fd);
      ++c.awaited;
    }
  return c.awaited == 0;
}

void StoreServer::Impl::clear_wait(int fd, Conn& c) {
  if (c.awaited == 0) return;
  for (auto it = waiters.begin(); it != waiters.end();) {
    auto& v = it->second;
    v.erase(std::remove(v.begin(), v.end(), fd), v.end());
    it = v.empty() ? waiters.erase(it) : std::next(it);
  }
  c.awaited = 0;
}

// The key now exists: the connections waiting for it (the first one only, for a queue push) count
// it; the ones that have all their keys get STOP_WAITING.
void StoreServer::Impl::wake(const std::string& key, bool just_one) {
  auto it = waiters.find(key);
  if (it == waiters.end()) return;
  auto& fds = it->second;
  while (!fds.empty()) {
    int fd = fds.front();
    fds.erase(fds.begin());
    Conn& c = conns.at(fd);
    if (--c.awaited == 0) send(fd, c, std::string(1, static_cast<char>(kStopWaiting)));
    if (just_one) break;
  }
  if (fds.empty()) waiters.erase(it);
}

void StoreServer::Impl::send(int fd, Conn& c, const std::string& bytes) {
  c.out += bytes;
  flush(fd, c);
}

void StoreServer::Impl::flush(int fd, Conn& c) {
  while (!c.out.empty() && !c.closing) {
    ssize_t n = ::send(fd, c.out.data(), c.out.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      c.out.erase(0, static_cast<size_t>(n));
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else {
      if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) c.closing = true;  // the peer is gone
      return;
    }
  }
}

void StoreServer::Impl::close_finished() {
  for (auto it = conns.begin(); it != conns.end();) {
    if (!it->second.closing) {
      ++it;
      continue;
    }
    clear_wait(it->first, it->second);
    ::close(it->first);
    it = conns.erase(it);
  }
}

}  // namespace lm::launch
