// HTTP(S)/S3 locations and the retrying fetch (see http.h).
#include "data/remote/http.h"

#if LM_REMOTE
#include <curl/curl.h>
#endif
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <mutex>
#include <random>
#include <thread>

#include "common/clock.h"
#include "common/errors.h"
#include "common/files.h"
#include "common/log.h"

namespace lm::data {
namespace {

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

bool starts_with(const std::string& s, const std::string& p) { return s.compare(0, p.size(), p) == 0; }

std::string trim_slashes(std::string s) {
  while (!s.empty() && s.back() == '/') s.pop_back();
  return s;
}

#if LM_REMOTE
void init_curl_once() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}
#endif

using clock::seconds_since;

}  // namespace

bool is_remote(const std::string& location) {
  return starts_with(location, "http://") || starts_with(location, "https://") || starts_with(location, "s3://");
}

RemoteLocation parse_location(const std::string& location, const std::string& key) {
  auto fail = [&](const std::string& why) { throw ConfigError("key '" + key + "': " + why + ", got '" + location + "'"); };
  RemoteLocation l;
  l.location = location;
  if (!starts_with(location, "s3://")) {
    l.base = trim_slashes(location);
    if (l.base.size() <= l.base.find("://") + 3) fail("a URL needs a host");
    return l;
  }
  const std::string rest = location.substr(5);
  const size_t slash = rest.find('/');
  const std::string bucket = rest.substr(0, slash);
  const std::string prefix = slash == std::string::npos ? "" : trim_slashes(rest.substr(slash + 1));
  if (bucket.empty()) fail("an s3 location is s3://bucket/prefix");
  l.s3 = true;
  l.region = env("AWS_REGION");
  if (l.region.empty()) l.region = env("AWS_DEFAULT_REGION");
  if (l.region.empty()) l.region = "us-east-1";
  l.key_id = env("AWS_ACCESS_KEY_ID");
  l.secret = env("AWS_SECRET_ACCESS_KEY");
  l.token = env("AWS_SESSION_TOKEN");
  if (l.key_id.empty() != l.secret.empty())
    fail("AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY must be set together");
  const std::string endpoint = trim_slashes(env("AWS_ENDPOINT_URL"));
  l.base = endpoint.empty() ? "https://" + bucket + ".s3." + l.region + ".amazonaws.com" : endpoint + "/" + bucket;
  if (!prefix.empty()) l.base += "/" + prefix;
  return l;
}

#if LM_REMOTE
Http::Http(RemoteLocation loc, double timeout_s) : loc_(std::move(loc)), timeout_s_(timeout_s) { init_curl_once(); }
#else
Http::Http(RemoteLocation loc, double timeout_s) : loc_(std::move(loc)), timeout_s_(timeout_s) {
  throw ConfigError("'" + loc_.location + "': remote datasets are not in this build (configured with LM_REMOTE=OFF)");
}
#endif

// One transfer's bookkeeping: where the bytes go and what the last try found.
struct Http::Attempt {
  std::string url;
  int fd = -1;            // download: the file; get: -1 (bytes go to `body`)
  std::string part;       // download: its path
  uint64_t size = 0;      // download: the object's size
  uint64_t have = 0;      // bytes in place before this try
  uint64_t progress = 0;  // bytes received by this try
  long status = 0;
  std::string body, error;  // get: the object; error: the last try's fault ("" = done)
  bool permanent = false;   // a 4xx other than 429: not retried
  bool restart = false;     // the server ignored Range: the file was emptied
};

#if LM_REMOTE
namespace {

size_t on_body(char* data, size_t one, size_t n, void* user) {
  auto& a = *static_cast<std::pair<Http::Attempt*, CURL*>*>(user);
  Http::Attempt& at = *a.first;
  const size_t bytes = one * n;
  curl_easy_getinfo(a.second, CURLINFO_RESPONSE_CODE, &at.status);
  if (at.status != 200 && at.status != 206) {  // an error page: keep its start for the message
    if (at.body.size() < 512) at.body.append(data, std::min<size_t>(bytes, 512));
    return bytes;
  }
  if (at.fd < 0) {
    at.body.append(data, bytes);
  } else {
    if (at.status == 200 && at.have > 0 && at.progress == 0) {  // Range ignored: start over
      if (::ftruncate(at.fd, 0) != 0) return 0;
      at.have = 0, at.restart = true;
    }
    for (size_t done = 0; done < bytes;) {
      size_t w = 0;
      if (files::file_system().write(at.fd, data + done, bytes - done, &w) != 0 || w == 0) return 0;
      done += w;
    }
  }
  at.progress += bytes;
  return bytes;
}

int on_progress(void* cancel, curl_off_t, curl_off_t, curl_off_t, curl_off_t) {
  return cancel && static_cast<const std::atomic<bool>*>(cancel)->load() ? 1 : 0;  // non-zero aborts
}

}  // namespace

// One GET; sets a.error (and a.permanent) on a fault, leaves it empty when the object is complete.
void Http::attempt(Attempt& a) const {
  a.error.clear(), a.status = 0, a.progress = 0, a.restart = false, a.permanent = false;
  if (a.fd < 0) a.body.clear();
  std::unique_ptr<CURL, decltype(&curl_easy_cleanup)> h(curl_easy_init(), curl_easy_cleanup);
  if (!h) throw Error("libcurl: curl_easy_init failed");
  CURL* c = h.get();
  std::pair<Attempt*, CURL*> user{&a, c};
  const long stall_s = std::max(1L, std::min(10L, static_cast<long>(timeout_s_ / 4)));
  curl_easy_setopt(c, CURLOPT_URL, a.url.c_str());
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 1L);
  curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT, stall_s);
  curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, 1L);  // a stall: no byte for stall_s
  curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME, stall_s);
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, &user);
  curl_easy_setopt(c, CURLOPT_NOPROGRESS, 0L);
  curl_easy_setopt(c, CURLOPT_XFERINFOFUNCTION, on_progress);
  curl_easy_setopt(c, CURLOPT_XFERINFODATA, const_cast<std::atomic<bool>*>(cancel_));
  const std::string range = std::to_string(a.have) + "-";
  if (a.fd >= 0 && a.have > 0) curl_easy_setopt(c, CURLOPT_RANGE, range.c_str());
  struct curl_slist* headers = nullptr;
  const std::string userpwd = loc_.key_id + ":" + loc_.secret, sigv4 = "aws:amz:" + loc_.region + ":s3";
  if (loc_.s3 && !loc_.key_id.empty()) {
    headers = curl_slist_append(headers, "x-amz-content-sha256: UNSIGNED-PAYLOAD");
    if (!loc_.token.empty()) headers = curl_slist_append(headers, ("x-amz-security-token: " + loc_.token).c_str());
    curl_easy_setopt(c, CURLOPT_AWS_SIGV4, sigv4.c_str());
    curl_easy_setopt(c, CURLOPT_USERPWD, userpwd.c_str());
  }
  curl_easy_setopt(c, CURLOPT_HTTPHEADER, headers);
  const CURLcode rc = curl_easy_perform(c);
  curl_slist_free_all(headers);
  curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &a.status);
  if (rc != CURLE_OK) {
    a.error = curl_easy_strerror(rc);
  } else if (a.status == 429 || a.status >= 500) {
    a.error = "HTTP " + std::to_string(a.status);
  } else if (a.status != 200 && a.status != 206) {
    a.error = "HTTP " + std::to_string(a.status) + (a.status == 404 ? " (not found)" : a.status == 403 ? " (forbidden)" : "");
    a.permanent = true;
  } else if (a.fd >= 0 && a.have + a.progress != a.size) {
    a.error = strf("short read: %llu of %llu bytes", static_cast<unsigned long long>(a.have + a.progress),
                   static_cast<unsigned long long>(a.size));
    if (a.have + a.progress > a.size) {  // longer than the manifest says: not the file we want
      a.permanent = true;
      a.error = strf("%llu bytes, the manifest says %llu", static_cast<unsigned long long>(a.have + a.progress),
                     static_cast<unsigned long long>(a.size));
    }
  }
}

// Tries until done; the fault clock restarts whenever a try made progress.
#else
void Http::attempt(Attempt&) const { throw ConfigError("remote datasets are not in this build (LM_REMOTE=OFF)"); }
#endif

void Http::retry_loop(Attempt& a) const {
  std::mt19937_64 rng(std::random_device{}());
  auto fault_start = std::chrono::steady_clock::now();
  for (int k = 0;; ++k) {
    if (a.fd >= 0) {
      struct stat st {};
      if (::fstat(a.fd, &st) != 0) throw Error(a.part + ": fstat failed");
      a.have = static_cast<uint64_t>(st.st_size);
      if (a.have == a.size) return;
    }
    attempt(a);
    if (a.error.empty()) return;
    if (cancel_ && cancel_->load()) throw Error(a.url + ": fetch cancelled");
    if (a.permanent) throw DataError(a.url + ": " + a.error);
    if (a.progress > 0) fault_start = std::chrono::steady_clock::now(), k = 0;
    const double fault_s = seconds_since(fault_start);
    if (fault_s > timeout_s_)
      throw RemoteError(strf("%s: unreachable for %.1f s, longer than data.remote_timeout_s = %g (last error: %s)",
                             a.url.c_str(), fault_s, timeout_s_, a.error.c_str()));
    const double cap = std::min(5.0, 0.1 * static_cast<double>(uint64_t{1} << std::min(k, 6)));
    const double delay = std::uniform_real_distribution<double>(0.5 * cap, cap)(rng);  // jitter
    log::warn(strf("%s: %s; retry %d in %.2f s", a.url.c_str(), a.error.c_str(), k + 1, delay));
    const auto wake = std::chrono::steady_clock::now() + std::chrono::duration<double>(std::min(delay, timeout_s_ - fault_s + 0.05));
    while (std::chrono::steady_clock::now() < wake && !(cancel_ && cancel_->load()))
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

std::string Http::get(const std::string& file) const {
  Attempt a;
  a.url = url(file);
  retry_loop(a);
  return a.body;
}

void Http::download(const std::string& file, int fd, const std::string& part, uint64_t size) const {
  Attempt a;
  a.url = url(file), a.fd = fd, a.part = part, a.size = size;
  retry_loop(a);
}

}  // namespace lm::data
