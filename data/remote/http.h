// Remote objects over HTTP(S) and S3 (libcurl; S3 requests signed by libcurl's AWS SigV4): where a
// dataset location points, and the fetch with retries that every remote byte goes through.
//
// Locations: "http://host/path", "https://host/path" (plain GETs), and "s3://bucket/prefix" with
//   AWS_ENDPOINT_URL       the endpoint (path-style: ENDPOINT/bucket/prefix/file); unset: AWS,
//                          https://bucket.s3.REGION.amazonaws.com/prefix/file
//   AWS_REGION, AWS_DEFAULT_REGION   the signing region (default us-east-1)
//   AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN   credentials (unset: unsigned)
//
// Faults: timeouts, stalls, connection resets, 429, 5xx and short reads are retried with exponential
// backoff and full jitter (0.1 s doubling to 5 s); a download resumes where it stopped with a Range
// request. A fault that lasts longer than the timeout without a byte of progress throws RemoteError
// naming the URL. Other 4xx answers (404, 403, ...) are bad input: DataError naming the URL.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

namespace lm::data {

// Where a remote dataset lives and how to sign requests to it.
struct RemoteLocation {
  std::string location;  // as the user wrote it
  std::string base;      // URL of the dataset directory, without a trailing '/'
  bool s3 = false;
  std::string region, key_id, secret, token;  // S3 signing
};

// True for http://, https:// and s3:// locations.
bool is_remote(const std::string& location);
// Parses a remote location (s3: reads the AWS_* environment). Throws ConfigError naming `key` when
// it is malformed or S3 credentials are half set.
RemoteLocation parse_location(const std::string& location, const std::string& key);

class Http {
 public:
  // timeout_s: the longest fault tolerated (data.remote_timeout_s).
  Http(RemoteLocation loc, double timeout_s);

  const RemoteLocation& where() const { return loc_; }
  // While *cancel is true, transfers and retries stop at once (throwing lm::Error): set by the
  // owner before it joins a thread that may be fetching.
  void set_cancel(const std::atomic<bool>* cancel) { cancel_ = cancel; }
  std::string url(const std::string& file) const { return loc_.base + "/" + file; }
  // The whole object (small ones: manifest.json).
  std::string get(const std::string& file) const;
  // Appends the object's bytes to the open file `fd` (path `part`, for messages) from its current
  // size until it holds `size` bytes (a partial file is resumed with Range).
  void download(const std::string& file, int fd, const std::string& part, uint64_t size) const;

  struct Attempt;  // one transfer's bookkeeping (http.cpp)

 private:
  void attempt(Attempt& a) const;
  void retry_loop(Attempt& a) const;

  RemoteLocation loc_;
  double timeout_s_;
  const std::atomic<bool>* cancel_ = nullptr;
};

}  // namespace lm::data
