// What store.cpp (the server) and store_client.cpp share of c10d's TCPStore wire protocol: the
// query types, the magic, the reply codes and the encoding of values (store.h describes the
// protocol). Internal to launch/launcher/.
#pragma once

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <chrono>
#include <cstdint>
#include <string>

namespace lm::launch::store_wire {

// Not "Clock": launcher.cpp, compiled in one unit with these files, has its own.
using StoreClock = std::chrono::steady_clock;

// Query types, numbered as in the 2.x dialect (the 1.x dialect is mapped onto them by the server).
enum class Op : uint8_t {
  kValidate, kSet, kCompareSet, kGet, kAdd, kCheck, kWait, kNumKeys, kDelete, kAppend, kMultiGet, kMultiSet,
  kCancelWait, kPing, kQueuePush, kQueuePop, kQueueLen, kInvalid = 255
};
// A connection's dialect: 2.x when it opened with VALIDATE, else 1.x (store.h); the server's.
enum class Dialect { kUnknown, kV1, kV2 };
constexpr uint32_t kValidateMagic = 0x3C85F7CE;          // VALIDATE's argument
constexpr uint8_t kReady = 0, kNotReady = 1;             // CHECK's reply
constexpr uint8_t kStopWaiting = 0, kWaitCanceled = 1;   // WAIT's and CANCEL_WAIT's replies

// Values travel in host byte order; strings and byte vectors as a uint64 length and the bytes.
template <typename T>
void put(std::string& out, T v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof v);
}
inline void put_bytes(std::string& out, const std::string& s) {
  put<uint64_t>(out, s.size());
  out += s;
}
inline std::string query(Op op) { return std::string(1, static_cast<char>(op)); }

// Small queries and replies go out at once (c10d sets it on both ends too).
inline void set_nodelay(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

}  // namespace lm::launch::store_wire
