#include "tools/launcher/status_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sodium.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <optional>
#include <vector>

#include "common/error.h"

namespace shoal {
namespace {

constexpr size_t kMaxRequestHead = 8192;
constexpr int kMaxConnections = 64;
constexpr double kConnectionDeadlineS = 5;

double Now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

std::string Response(int code, const char* reason, const char* type, const std::string& body, bool head_only) {
  std::string r = "HTTP/1.1 " + std::to_string(code) + " " + reason + "\r\nContent-Type: " + type +
                  "\r\nContent-Length: " + std::to_string(body.size()) +
                  "\r\nCache-Control: no-store\r\nX-Content-Type-Options: nosniff\r\nConnection: close\r\n\r\n";
  return head_only ? r : r + body;
}

// The value of `key` in a query string "a=1&token=x", or nullopt.
std::optional<std::string> QueryValue(const std::string& query, const std::string& key) {
  size_t at = 0;
  while (at <= query.size()) {
    size_t end = query.find('&', at);
    if (end == std::string::npos) end = query.size();
    if (query.compare(at, key.size() + 1, key + "=") == 0) return query.substr(at + key.size() + 1, end - at - key.size() - 1);
    at = end + 1;
  }
  return std::nullopt;
}

bool SameSecret(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char d = 0;
  for (size_t i = 0; i < a.size(); ++i) d |= (unsigned char)(a[i] ^ b[i]);
  return d == 0;
}

}  // namespace

struct StatusServer::Conn {
  int fd = -1;
  std::string in, out;
  size_t sent = 0;
  bool responding = false;
  double deadline = 0;
};

StatusServer::StatusServer(const std::string& bind_addr, int port, std::string page_html, std::string token)
    : bind_addr_(bind_addr),
      page_(std::move(page_html)),
      token_(std::move(token)),
      json_(std::make_shared<const std::string>("{}")) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(uint16_t(port));
  const std::string where = "status page at " + bind_addr + ":" + std::to_string(port);
  if (inet_pton(AF_INET, bind_addr.c_str(), &a.sin_addr) != 1) throw Error(where + ": not an IPv4 address");
  listen_fd_ = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (listen_fd_ < 0) throw Error(where + ": socket: " + strerror(errno));
  int one = 1;
  setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || listen(listen_fd_, 64) != 0) {
    std::string why = strerror(errno);
    close(listen_fd_);
    throw Error(where + ": cannot listen: " + why + " (set [job] status_port to a free port, or 0 for any)");
  }
  socklen_t len = sizeof a;
  getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&a), &len);
  port_ = ntohs(a.sin_port);
  if (pipe2(wake_, O_CLOEXEC | O_NONBLOCK) != 0) {
    close(listen_fd_);
    throw Error(where + ": pipe: " + strerror(errno));
  }
  thread_ = std::thread([this] { Loop(); });
}

StatusServer::~StatusServer() {
  stop_ = true;
  if (write(wake_[1], "x", 1) < 0) {
  }  // the loop also wakes every 200 ms
  if (thread_.joinable()) thread_.join();
  close(listen_fd_);
  close(wake_[0]);
  close(wake_[1]);
}

std::string StatusServer::NewToken() {
  if (sodium_init() < 0) throw Error("status page: libsodium cannot start, so no token can be drawn");
  unsigned char raw[16];
  randombytes_buf(raw, sizeof raw);
  char hex[2 * sizeof raw + 1];
  sodium_bin2hex(hex, sizeof hex, raw, sizeof raw);
  return hex;
}

std::string StatusServer::url(const std::string& path) const {
  return "http://" + (bind_addr_ == "0.0.0.0" ? std::string("127.0.0.1") : bind_addr_) + ":" + std::to_string(port_) +
         "/" + path + (token_.empty() ? "" : "?token=" + token_);
}

void StatusServer::Publish(std::string json) {
  auto p = std::make_shared<const std::string>(std::move(json));
  std::lock_guard<std::mutex> l(mu_);
  json_ = std::move(p);
}

std::shared_ptr<const std::string> StatusServer::Snapshot() const {
  std::lock_guard<std::mutex> l(mu_);
  return json_;
}

// The whole response to one request head (request line + headers, without the body).
std::string StatusServer::Respond(const std::string& head) const {
  size_t eol = head.find_first_of("\r\n");
  std::string line = head.substr(0, eol);
  size_t sp1 = line.find(' '), sp2 = sp1 == std::string::npos ? sp1 : line.find(' ', sp1 + 1);
  if (sp1 == std::string::npos || sp2 == std::string::npos || line.compare(sp2 + 1, 5, "HTTP/") != 0)
    return Response(400, "Bad Request", "text/plain", "bad request line\n", false);
  std::string method = line.substr(0, sp1), target = line.substr(sp1 + 1, sp2 - sp1 - 1);
  bool head_only = method == "HEAD";
  if (method != "GET" && !head_only)
    return Response(405, "Method Not Allowed", "text/plain", "only GET and HEAD\n", false);
  const size_t q = target.find('?');
  std::string path = target.substr(0, q);
  if (!token_.empty()) {
    auto given = QueryValue(q == std::string::npos ? "" : target.substr(q + 1), "token");
    if (!given || !SameSecret(*given, token_))
      return Response(401, "Unauthorized", "text/plain",
                      "this job has [security] keys: open the status URL shoal run printed (it carries ?token=)\n",
                      head_only);
  }
  if (path == "/" || path == "/index.html") return Response(200, "OK", "text/html; charset=utf-8", page_, head_only);
  if (path == "/status.json") return Response(200, "OK", "application/json", *Snapshot(), head_only);
  return Response(404, "Not Found", "text/plain", "not found (try / or /status.json)\n", head_only);
}

void StatusServer::Loop() {
  std::vector<Conn> conns;
  while (!stop_) {
    std::vector<pollfd> fds = {{wake_[0], POLLIN, 0}, {listen_fd_, POLLIN, 0}};
    for (auto& c : conns) fds.push_back({c.fd, short(c.responding ? POLLOUT : POLLIN), 0});
    int n = poll(fds.data(), nfds_t(fds.size()), 200);
    if (n < 0 && errno != EINTR) break;
    if (stop_) break;
    const double now = Now();
    const size_t polled = conns.size();  // connections accepted below were not polled yet
    if (n > 0 && (fds[1].revents & POLLIN)) {
      // Connections given up on (deadline 0) are closed below; they no longer count.
      int live = 0;
      for (const Conn& c : conns) live += c.deadline != 0;
      while (true) {
        int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) break;  // EAGAIN, or a connection that went away before we took it
        if (live >= kMaxConnections) {
          // Full: the oldest connection still waiting for its request goes, so that clients
          // which never finish one (slowloris) cannot lock out one that sends it whole. If
          // every connection is being answered, the newcomer goes instead.
          Conn* oldest = nullptr;
          for (Conn& c : conns)
            if (!c.responding && c.deadline != 0 && (!oldest || c.deadline < oldest->deadline)) oldest = &c;
          if (!oldest) {
            close(fd);
            continue;
          }
          oldest->deadline = 0;
          --live;
        }
        ++live;
        Conn c;
        c.fd = fd;
        c.deadline = now + kConnectionDeadlineS;
        conns.push_back(std::move(c));
      }
    }
    for (size_t i = 0; i < polled && n > 0; ++i) {
      Conn& c = conns[i];
      short re = fds[i + 2].revents;
      if (!re || c.deadline == 0) continue;  // 0: evicted above, closed below
      if (!c.responding && (re & (POLLIN | POLLHUP | POLLERR))) {
        char buf[4096];
        ssize_t got = recv(c.fd, buf, sizeof buf, 0);
        if (got <= 0) {
          if (got < 0 && (errno == EAGAIN || errno == EINTR)) continue;
          c.deadline = 0;  // closed or failed before a whole request: drop it
          continue;
        }
        c.in.append(buf, size_t(got));
        size_t end = c.in.find("\r\n\r\n");
        if (end == std::string::npos) end = c.in.find("\n\n");
        if (end != std::string::npos) {
          c.out = Respond(c.in.substr(0, end));
          c.responding = true;
        } else if (c.in.size() > kMaxRequestHead) {
          c.out = Response(431, "Request Header Fields Too Large", "text/plain", "request head over 8 KiB\n", false);
          c.responding = true;
        }
        if (c.responding) {
          ++requests_;
          c.in.clear();
          c.in.shrink_to_fit();
        }
      } else if (c.responding && (re & (POLLOUT | POLLHUP | POLLERR))) {
        ssize_t put = send(c.fd, c.out.data() + c.sent, c.out.size() - c.sent, MSG_NOSIGNAL);
        if (put < 0 && (errno == EAGAIN || errno == EINTR)) continue;
        if (put <= 0) {
          c.deadline = 0;
          continue;
        }
        c.sent += size_t(put);
        if (c.sent == c.out.size()) {
          shutdown(c.fd, SHUT_WR);
          c.deadline = 0;
        }
      }
    }
    // Done, failed or too slow: closed.
    for (size_t i = 0; i < conns.size();) {
      if (conns[i].deadline <= now || conns[i].deadline == 0) {
        close(conns[i].fd);
        conns[i] = std::move(conns.back());
        conns.pop_back();
      } else {
        ++i;
      }
    }
  }
  for (auto& c : conns) close(c.fd);
}

}  // namespace shoal
