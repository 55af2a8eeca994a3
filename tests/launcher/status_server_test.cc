// The status page's server over real loopback sockets: a job with keys gets a token, and a
// request without it (or with a wrong one, or one a byte short) is answered 401, and
// clients that never finish their request do not lock the others out.
#include "tools/launcher/status_server.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <string>
#include <vector>

namespace shoal {
namespace {

// One whole HTTP exchange; the response as received (the server closes after it).
std::string Get(int port, const std::string& target) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  timeval tv{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(uint16_t(port));
  inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  std::string out;
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) {
    std::string req = "GET " + target + " HTTP/1.1\r\nHost: x\r\n\r\n";
    if (write(fd, req.data(), req.size()) == ssize_t(req.size())) {
      char buf[4096];
      ssize_t n;
      while ((n = read(fd, buf, sizeof buf)) > 0) out.append(buf, size_t(n));
    }
  }
  close(fd);
  return out;
}

int Code(const std::string& response) { return response.size() > 12 ? std::stoi(response.substr(9, 3)) : -1; }

TEST(StatusServer, WithATokenOnlyRequestsThatCarryItAreServed) {
  const std::string token = StatusServer::NewToken();
  ASSERT_EQ(token.size(), 32u);
  EXPECT_NE(StatusServer::NewToken(), token);
  StatusServer s("127.0.0.1", 0, "<html>page</html>", token);
  s.Publish("{\"step\":7}");
  EXPECT_EQ(s.url(), "http://127.0.0.1:" + std::to_string(s.port()) + "/?token=" + token);
  EXPECT_EQ(s.url("status.json"), "http://127.0.0.1:" + std::to_string(s.port()) + "/status.json?token=" + token);
  EXPECT_EQ(Code(Get(s.port(), "/")), 401);
  EXPECT_EQ(Code(Get(s.port(), "/status.json")), 401);
  EXPECT_EQ(Code(Get(s.port(), "/status.json?token=")), 401);
  EXPECT_EQ(Code(Get(s.port(), "/status.json?token=" + token.substr(1))), 401);
  std::string wrong = token;
  wrong[5] = wrong[5] == 'a' ? 'b' : 'a';
  EXPECT_EQ(Code(Get(s.port(), "/status.json?token=" + wrong)), 401);
  EXPECT_EQ(Code(Get(s.port(), "/?tok=" + token)), 401);
  std::string ok = Get(s.port(), "/status.json?x=1&token=" + token);
  EXPECT_EQ(Code(ok), 200) << ok;
  EXPECT_NE(ok.find("{\"step\":7}"), std::string::npos);
  EXPECT_NE(Get(s.port(), "/?token=" + token).find("<html>page</html>"), std::string::npos);
}

TEST(StatusServer, WithoutATokenEveryGetIsServed) {
  StatusServer s("127.0.0.1", 0, "<html>page</html>");
  EXPECT_EQ(s.url(), "http://127.0.0.1:" + std::to_string(s.port()) + "/");
  EXPECT_EQ(Code(Get(s.port(), "/status.json")), 200);
  EXPECT_EQ(Code(Get(s.port(), "/")), 200);
}

// A connection that sends part of a request and then nothing (slowloris), many times over:
// the server holds at most 64 connections, and a full table of idle half-requests must not
// turn away a client that sends its whole request at once.
TEST(StatusServer, ConnectionsThatNeverFinishTheirRequestDoNotLockOthersOut) {
  StatusServer s("127.0.0.1", 0, "<html>page</html>");
  std::vector<int> idle;
  for (int i = 0; i < 80; ++i) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(uint16_t(s.port()));
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    ASSERT_EQ(write(fd, "GET / HTTP/1.1\r\n", 16), 16);
    idle.push_back(fd);
  }
  EXPECT_EQ(Code(Get(s.port(), "/status.json")), 200);
  EXPECT_EQ(Code(Get(s.port(), "/")), 200);
  for (int fd : idle) close(fd);
}

}  // namespace
}  // namespace shoal
