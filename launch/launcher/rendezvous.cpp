// The launchers' rendezvous (see rendezvous.h for the protocol): node 0's Coordinator, its server
// (a poll() loop on its own thread over line-buffered connections) and every node's Peer.
#include "launch/launcher/rendezvous.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>

#include "common/errors.h"
#include "common/log.h"

namespace lm::launch {
namespace {

using Clock = std::chrono::steady_clock;
constexpr size_t kMaxRequestLine = 4096;  // longer: not a launcher; the connection is closed

std::string join_ints(const std::vector<int>& v) {
  std::string s;
  for (int x : v) s += (s.empty() ? "" : ",") + std::to_string(x);
  return s;
}

std::vector<int> split_ints(const std::string& s) {
  std::vector<int> v;
  std::stringstream in(s);
  std::string x;
  while (std::getline(in, x, ',')) v.push_back(std::atoi(x.c_str()));
  return v;
}

// A socket bound to `port` of every interface: IPv6 accepting IPv4 too, else IPv4 alone; -1 with
// errno set when neither binds.
int bind_any(int port, int type_flags) {
  int err = 0;
  for (int family : {AF_INET6, AF_INET}) {
    int fd = ::socket(family, SOCK_STREAM | SOCK_CLOEXEC | type_flags, 0);
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
    if (::bind(fd, reinterpret_cast<sockaddr*>(&a), len) == 0) return fd;
    err = errno;
    ::close(fd);
    if (err == EADDRINUSE || err == EACCES) break;  // IPv4 would say the same
  }
  errno = err;
  return -1;
}

int bound_port(int fd) {
  sockaddr_storage a{};
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  return a.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&a)->sin6_port)
                                 : ntohs(reinterpret_cast<sockaddr_in*>(&a)->sin_port);
}

int millis_left(Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::max<int64_t>(0, std::min<int64_t>(left, 1 << 30)));
}

// Waits until `fd` is ready for `events`; false when `deadline` came first (EINTR polls again).
bool ready_by(int fd, short events, Clock::time_point deadline) {
  while (true) {
    pollfd p{fd, events, 0};
    int rc = ::poll(&p, 1, millis_left(deadline));
    if (rc > 0 || (rc < 0 && errno != EINTR)) return true;  // an error: the read or write that follows says which
    if (rc == 0 && Clock::now() >= deadline) return false;
  }
}

// One non-blocking connection attempt to host:port, bounded by `deadline`; -1 with `why` on failure.
int connect_once(const std::string& host, int port, Clock::time_point deadline, std::string& why) {
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

int free_port() {
  int fd = bind_any(0, 0);
  if (fd < 0) throw Error(strf("cannot find a free port: %s", std::strerror(errno)));
  int port = bound_port(fd);
  ::close(fd);
  return port;
}

// ---- Coordinator ------------------------------------------------------------------------------

struct Coordinator::State {
  struct Attempt {
    std::map<int, int> nproc;  // node -> workers, of the nodes that joined
    std::set<int> done;
    std::optional<Failure> failure;
    int port = 0;  // once every node joined
  };
  const Options& o;
  const int fixed_port;
  std::mutex mu;
  std::set<int> connected;          // nodes that said HELLO
  std::set<int> ended;              // nodes that sent END or disconnected
  std::map<int, int> node_attempt;  // node -> the last attempt it joined
  std::map<int, Attempt> attempts;
  std::optional<std::pair<int, int>> stop;  // signal, node

  State(const Options& opts, int port) : o(opts), fixed_port(port) {}

  std::string stop_reply() const { return strf("STOP %d %d", stop->first, stop->second); }

  std::string hello(int* node, std::istringstream& in) {
    std::string version;
    in >> version;
    if (version != kProtocol)
      return strf("ERR node 0 speaks %s, this node '%s': run the same launch on every node", kProtocol, version.c_str());
    char run[256] = "";
    int k = -1, nnodes = 0, max_restarts = -1;
    std::string rest;
    std::getline(in, rest);
    if (std::sscanf(rest.c_str(), " run=%255s node=%d nnodes=%d max_restarts=%d", run, &k, &nnodes, &max_restarts) != 4)
      return "ERR malformed HELLO";
    if (run != o.run_id || nnodes != o.nnodes || max_restarts != o.max_restarts)
      return strf("ERR node 0 runs with --run-id %s --nnodes %d --max-restarts %d, this node with %s, %d and %d: "
                  "every node needs the same values",
                  o.run_id.c_str(), o.nnodes, o.max_restarts, run, nnodes, max_restarts);
    if (k < 0 || k >= o.nnodes) return strf("ERR node rank %d is outside [0, %d)", k, o.nnodes);
    if (connected.count(k)) return strf("ERR node %d already joined (two launchers with --node-rank %d?)", k, k);
    connected.insert(k);
    *node = k;
    return strf("OK %s", kProtocol);
  }

  std::string join(int node, int a, int nproc) {
    if (stop) return stop_reply();
    Attempt& at = attempts[a];
    at.nproc[node] = nproc;
    node_attempt[node] = a;
    if (static_cast<int>(at.nproc.size()) < o.nnodes) {
      std::vector<int> missing;
      for (int k = 0; k < o.nnodes; ++k)
        if (!at.nproc.count(k)) missing.push_back(k);
      return "WAIT " + join_ints(missing);
    }
    if (at.port == 0) at.port = fixed_port ? fixed_port : fresh_port(a);
    std::vector<int> nprocs;
    for (auto& [k, n] : at.nproc) nprocs.push_back(n);
    return strf("GO %d ", at.port) + join_ints(nprocs);
  }

  // A free port other than the previous attempt's (whose rank 0 may have left connections behind).
  int fresh_port(int a) {
    auto prev = attempts.find(a - 1);
    int port = free_port();
    for (int i = 0; i < 8 && prev != attempts.end() && port == prev->second.port; ++i) port = free_port();
    return port;
  }

  std::string poll(int a) {
    Attempt& at = attempts[a];
    if (at.failure) return "FAILED " + at.failure->encode();
    if (stop) return stop_reply();
    if (static_cast<int>(at.done.size()) == o.nnodes) return "DONE";
    return "RUN";
  }

  std::string handle(int* node, const std::string& line) {
    std::lock_guard<std::mutex> lock(mu);
    std::istringstream in(line);
    std::string verb;
    in >> verb;
    if (verb == "HELLO") return hello(node, in);
    if (*node < 0) return "ERR HELLO first";
    int a = -1;
    if (verb == "JOIN" || verb == "DONE" || verb == "FAIL" || verb == "POLL") {
      if (!(in >> a) || a < 0) return "ERR malformed " + verb;
    }
    if (verb == "JOIN") {
      int nproc = 0;
      if (!(in >> nproc) || nproc < 1) return "ERR malformed JOIN";
      return join(*node, a, nproc);
    }
    if (verb == "DONE") {
      attempts[a].done.insert(*node);
      return "OK";
    }
    if (verb == "FAIL") {
      std::string f;
      std::getline(in, f);
      const size_t start = f.find_first_not_of(' ');
      if (start == std::string::npos) return "ERR malformed FAIL";
      Attempt& at = attempts[a];
      if (!at.failure) at.failure = Failure::decode(f.substr(start));
      return "FAILED " + at.failure->encode();
    }
    if (verb == "POLL") return poll(a);
    if (verb == "STOP") {
      int sig = 0;
      if (!(in >> sig) || sig <= 0) return "ERR malformed STOP";
      if (!stop) stop = std::make_pair(sig, *node);
      return "OK";
    }
    if (verb == "END") {
      ended.insert(*node);
      return "OK";
    }
    if (verb == "ENDED") return std::to_string(ended.size());
    return "ERR unknown request '" + verb + "'";
  }

  void lost(int node) {
    std::lock_guard<std::mutex> lock(mu);
    if (node < 0 || ended.count(node)) return;
    ended.insert(node);
    auto it = node_attempt.find(node);
    if (it == node_attempt.end()) return;
    Attempt& at = attempts[it->second];
    if (at.failure || at.done.count(node)) return;
    Failure f;
    f.node = node;
    at.failure = f;  // rank -1: the node's launcher, not a worker
  }
};

Coordinator::Coordinator(const Options& o, int fixed_port) : s_(std::make_unique<State>(o, fixed_port)) {}
Coordinator::~Coordinator() = default;
std::string Coordinator::handle(int* node, const std::string& line) { return s_->handle(node, line); }
void Coordinator::lost(int node) { s_->lost(node); }

// ---- CoordServer ------------------------------------------------------------------------------

struct CoordServer::Impl {
  struct Conn {
    int node = -1;
    std::string in, out;
  };
  Coordinator& coord;
  int listen_fd = -1;
  int stop_pipe[2] = {-1, -1};
  std::map<int, Conn> conns;
  std::thread thread;

  explicit Impl(Coordinator& c) : coord(c) {}

  void close_conn(int fd) {
    coord.lost(conns[fd].node);
    ::close(fd);
    conns.erase(fd);
  }

  // Reads what arrived and answers every complete line; false when the connection is finished.
  bool read_from(int fd, Conn& c) {
    char buf[4096];
    while (true) {
      ssize_t n = ::recv(fd, buf, sizeof buf, 0);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) break;  // EAGAIN
      if (n == 0) return false;
      c.in.append(buf, static_cast<size_t>(n));
    }
    size_t nl;
    while ((nl = c.in.find('\n')) != std::string::npos) {
      std::string line = c.in.substr(0, nl);
      c.in.erase(0, nl + 1);
      c.out += coord.handle(&c.node, line) + "\n";
    }
    return c.in.size() <= kMaxRequestLine;
  }

  bool write_to(int fd, Conn& c) {
    while (!c.out.empty()) {
      ssize_t n = ::send(fd, c.out.data(), c.out.size(), MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return errno == EAGAIN || errno == EWOULDBLOCK;
      c.out.erase(0, static_cast<size_t>(n));
    }
    return true;
  }

  void run() {
    while (true) {
      std::vector<pollfd> fds = {{stop_pipe[0], POLLIN, 0}, {listen_fd, POLLIN, 0}};
      for (auto& [fd, c] : conns) fds.push_back({fd, static_cast<short>(POLLIN | (c.out.empty() ? 0 : POLLOUT)), 0});
      if (::poll(fds.data(), fds.size(), -1) < 0) continue;  // EINTR
      if (fds[0].revents) return;
      if (fds[1].revents & POLLIN) {
        int fd;
        while ((fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC)) >= 0) {
          int one = 1;
          ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
          conns[fd] = Conn{};
        }
      }
      for (size_t i = 2; i < fds.size(); ++i) {
        if (!fds[i].revents) continue;
        int fd = fds[i].fd;
        Conn& c = conns[fd];
        bool ok = !(fds[i].revents & (POLLIN | POLLHUP | POLLERR)) || read_from(fd, c);
        if (ok) ok = write_to(fd, c);
        if (!ok) close_conn(fd);
      }
    }
  }
};

CoordServer::CoordServer(Coordinator& coord, int port) : impl_(std::make_unique<Impl>(coord)) {
  impl_->listen_fd = bind_any(port, SOCK_NONBLOCK);
  if (impl_->listen_fd < 0 || ::listen(impl_->listen_fd, SOMAXCONN) != 0)
    throw Error(strf("cannot listen on port %d: %s", port, std::strerror(errno)));
  if (::pipe2(impl_->stop_pipe, O_CLOEXEC) != 0) throw Error("pipe2 failed");
  impl_->thread = std::thread([this] { impl_->run(); });
}

CoordServer::~CoordServer() {
  if (impl_->thread.joinable()) {
    char b = 1;
    ssize_t ignored = ::write(impl_->stop_pipe[1], &b, 1);
    (void)ignored;
    impl_->thread.join();
  }
  for (auto& [fd, c] : impl_->conns) ::close(fd);
  for (int fd : {impl_->listen_fd, impl_->stop_pipe[0], impl_->stop_pipe[1]})
    if (fd >= 0) ::close(fd);
}

// ---- Peer -------------------------------------------------------------------------------------

Peer::Peer(const Options& o, Coordinator& coord) : o_(o), coord_(&coord), where_("node 0") {}

Peer::Peer(const Options& o, const std::string& host, int port, std::chrono::milliseconds connect_timeout,
           std::chrono::milliseconds call_timeout)
    : o_(o), where_(host + ":" + std::to_string(port)), call_timeout_(call_timeout) {
  const auto deadline = Clock::now() + connect_timeout;
  std::string why;
  while ((fd_ = connect_once(host, port, deadline, why)) < 0) {
    if (Clock::now() >= deadline)
      throw Error(strf("no launcher answered at %s within %g s (%s)", where_.c_str(), connect_timeout.count() / 1e3,
                       why.c_str()));
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  int one = 1;
  ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

Peer::~Peer() {
  if (fd_ >= 0) ::close(fd_);
}

std::string Peer::call(const std::string& line) {
  std::string reply = coord_ ? coord_->handle(&node_, line) : exchange(line);
  // A refusal: this node's options disagree with node 0's (or this is not the same launch).
  if (reply.rfind("ERR ", 0) == 0) throw UsageError(reply.substr(4));
  return reply;
}

std::string Peer::exchange(const std::string& line) {
  const auto deadline = Clock::now() + call_timeout_;
  const std::string req = line + "\n";
  for (size_t done = 0; done < req.size();) {
    ssize_t n = ::send(fd_, req.data() + done, req.size() - done, MSG_NOSIGNAL);
    if (n >= 0) {
      done += static_cast<size_t>(n);
      continue;
    }
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK)
      throw Error(strf("node 0's launcher at %s closed the connection (%s)", where_.c_str(), std::strerror(errno)));
    if (!ready_by(fd_, POLLOUT, deadline))
      throw Error(strf("node 0's launcher at %s took no data for %g s", where_.c_str(), call_timeout_.count() / 1e3));
  }
  size_t nl;
  while ((nl = buf_.find('\n')) == std::string::npos) {
    char b[4096];
    ssize_t n = ::recv(fd_, b, sizeof b, 0);
    if (n > 0) {
      buf_.append(b, static_cast<size_t>(n));
      if (buf_.size() > kMaxRequestLine) throw Error(strf("%s does not speak %s", where_.c_str(), kProtocol));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK))
      throw Error(strf("node 0's launcher at %s closed the connection", where_.c_str()));
    if (!ready_by(fd_, POLLIN, deadline))
      throw Error(strf("no answer from %s within %g s (is it node 0's launch?)", where_.c_str(),
                       call_timeout_.count() / 1e3));
  }
  std::string reply = buf_.substr(0, nl);
  buf_.erase(0, nl + 1);
  return reply;
}

void Peer::hello() {
  std::string reply = call(strf("HELLO %s run=%s node=%d nnodes=%d max_restarts=%d", kProtocol, o_.run_id.c_str(),
                                o_.node_rank, o_.nnodes, o_.max_restarts));
  if (reply != strf("OK %s", kProtocol))
    throw Error(strf("%s is not node 0's launch (it answered '%s')", where_.c_str(), reply.c_str()));
}

Poll Peer::parse_poll(const std::string& reply) {
  Poll p;
  std::istringstream in(reply);
  std::string verb;
  in >> verb;
  if (verb == "WAIT") {
    std::string m;
    in >> m;
    p.kind = Poll::kWait;
    p.missing = split_ints(m);
  } else if (verb == "GO") {
    std::string n;
    in >> p.port >> n;
    p.kind = Poll::kGo;
    p.node_nproc = split_ints(n);
    if (p.port <= 0 || static_cast<int>(p.node_nproc.size()) != o_.nnodes)
      throw Error(strf("malformed reply from %s: '%s'", where_.c_str(), reply.c_str()));
  } else if (verb == "RUN") {
    p.kind = Poll::kRunning;
  } else if (verb == "DONE") {
    p.kind = Poll::kDone;
  } else if (verb == "FAILED") {
    std::string f;
    std::getline(in, f);
    p.kind = Poll::kFailed;
    p.failure = Failure::decode(f.empty() ? f : f.substr(1));
  } else if (verb == "STOP") {
    p.kind = Poll::kStopped;
    in >> p.signal >> p.node;
  } else {
    throw Error(strf("malformed reply from %s: '%s'", where_.c_str(), reply.c_str()));
  }
  return p;
}

Poll Peer::join(int attempt, int nproc) { return parse_poll(call(strf("JOIN %d %d", attempt, nproc))); }
void Peer::done(int attempt) { call(strf("DONE %d", attempt)); }
Failure Peer::fail(int attempt, const Failure& f) {
  return parse_poll(call(strf("FAIL %d ", attempt) + f.encode())).failure;
}
Poll Peer::poll(int attempt) { return parse_poll(call(strf("POLL %d", attempt))); }
void Peer::stop(int signal) { call(strf("STOP %d", signal)); }
void Peer::end() { call("END"); }
int Peer::ended() { return std::atoi(call("ENDED").c_str()); }

}  // namespace lm::launch
