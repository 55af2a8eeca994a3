// The status page's HTTP server: a small loopback-by-default server on a plain socket that
// serves two documents, `/` (the page, fixed at construction) and `/status.json` (whatever
// the launcher last published). Its own thread runs one poll loop over non-blocking
// sockets, so a client can never block the launcher: a request head over 8 KiB is answered
// 431, a connection that has not finished within 5 s is closed, at most 64 connections are
// open at once (when full, a newcomer evicts the oldest connection still sending its request,
// so idle half-requests cannot lock clients out; if all are being answered, it is closed), and only GET and HEAD are served. Sockets are
// close-on-exec, so the job's processes never inherit them. With a token, requests without
// it get 401 (compared in constant time).
//
// Thread-safe: Publish may be called from any thread while the server runs.
#pragma once
#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

namespace shoal {

class StatusServer {
 public:
  // Binds `bind_addr` (IPv4) at `port` (0: a free port the kernel picks) and starts serving;
  // throws shoal::Error naming the address when it cannot. A non-empty `token` (a job with
  // [security] keys) is required as `?token=` on every request, else 401: the page carries
  // the job's figures and host names, and any local user could otherwise read them.
  StatusServer(const std::string& bind_addr, int port, std::string page_html, std::string token = "");
  ~StatusServer();  // stops the thread and closes every socket
  StatusServer(const StatusServer&) = delete;
  StatusServer& operator=(const StatusServer&) = delete;

  // 128 random bits in hex (libsodium), for `token`.
  static std::string NewToken();

  int port() const { return port_; }
  // http://ADDR:PORT/ (for a wildcard bind, with 127.0.0.1 as the host that surely works),
  // then `path`, with ?token=... when there is one.
  std::string url(const std::string& path = "") const;
  // The body /status.json serves from now on.
  void Publish(std::string json);
  // Requests answered so far (any status), for tests and the curious.
  int64_t requests() const { return requests_.load(); }

 private:
  struct Conn;
  void Loop();
  std::shared_ptr<const std::string> Snapshot() const;
  std::string Respond(const std::string& head) const;

  std::string bind_addr_;
  int port_ = 0, listen_fd_ = -1, wake_[2] = {-1, -1};
  const std::string page_;
  const std::string token_;
  mutable std::mutex mu_;
  std::shared_ptr<const std::string> json_;
  std::atomic<bool> stop_{false};
  std::atomic<int64_t> requests_{0};
  std::thread thread_;
};

}  // namespace shoal
