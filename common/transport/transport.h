// The one class that knows ZeroMQ. A message is one Cap'n Proto header frame followed by
// raw tensor frames; tensor bytes are handed to ZeroMQ by pointer (zmq_msg_init_data) and
// received frames stay alive as the tensor buffer, so no layer copies them.
#pragma once
#include <atomic>
#include <capnp/message.h>
#include <capnp/serialize.h>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>
#include <zmq.hpp>

#include "common/dtype.h"
#include "common/messages/schema.capnp.h"

namespace shoal {

// CurveZMQ keys (Z85, 40 characters each). All empty = plaintext.
struct CurveKeys {
  std::string server_public, server_secret;
  std::string client_public, client_secret;
  bool enabled() const { return !server_public.empty(); }
};

// A tensor frame to send. `data` must stay valid until ZeroMQ releases it; `keep` (if
// set) is held until then, and `on_release` runs then (from ZeroMQ's I/O thread).
struct Payload {
  const void* data = nullptr;
  size_t size = 0;
  std::shared_ptr<const void> keep;
  std::function<void()> on_release;
};

struct OutMessage {
  // Headers are a few hundred bytes; Cap'n Proto's default first segment (8 KiB, zeroed)
  // would cost more than the message.
  capnp::MallocMessageBuilder builder{128};
  std::vector<Payload> payloads;
  msg::Header::Builder header() { return builder.getRoot<msg::Header>(); }
};

// A received message. The header is parsed from an aligned copy of its (small) frame;
// payload frames are kept as received.
class InMessage {
 public:
  zmq::message_t identity;  // ROUTER peer id (empty on DEALER sockets)
  std::vector<zmq::message_t> payloads;
  msg::Header::Reader header() const { return reader_->getRoot<msg::Header>(); }
  // Parses `frame` as the header; throws shoal::Error saying what is wrong with it.
  void ParseHeader(const zmq::message_t& frame);
  // Checks that the tensor metas match the frames (count, byte sizes, dtype x shape).
  void ValidateTensors() const;

 private:
  kj::Array<capnp::word> words_;
  std::unique_ptr<capnp::FlatArrayMessageReader> reader_;
};

// Connection events reported by the socket monitor (handshake failures, disconnects).
struct SocketEvent {
  int event = 0;
  int value = 0;
  std::string endpoint;
  std::string Describe() const;  // one line, e.g. "handshake failed: ..."
};

class Transport {
 public:
  enum class Kind { kServer, kClient };  // ROUTER (bind) | DEALER (connect)
  Transport(zmq::context_t& ctx, Kind kind, const CurveKeys& keys);
  ~Transport();
  Transport(const Transport&) = delete;
  Transport& operator=(const Transport&) = delete;

  // Binds and returns the resolved endpoint (so "tcp://127.0.0.1:*" works).
  std::string Bind(const std::string& endpoint);
  void Connect(const std::string& endpoint);
  // Sends header + payloads; `to` is the peer identity on a server socket.
  void Send(OutMessage& m, const zmq::message_t* to = nullptr);
  // Receives one whole message, waiting at most timeout_ms (-1 = forever); false on
  // timeout. A frame sequence that is not a valid message throws BadMessage.
  bool Recv(InMessage* m, int timeout_ms);

  // Reports handshake failures and disconnects through Monitor() + DrainEvents().
  void EnableMonitor();
  zmq::socket_t* monitor_socket() { return monitor_.get(); }
  std::vector<SocketEvent> DrainEvents();

  zmq::socket_t& socket() { return socket_; }
  Kind kind() const { return kind_; }
  uint64_t bytes_sent() const { return bytes_sent_; }

 private:
  zmq::context_t& ctx_;
  Kind kind_;
  zmq::socket_t socket_;
  std::unique_ptr<zmq::socket_t> monitor_;
  uint64_t bytes_sent_ = 0;
};

// Thrown by Recv for a message that cannot be decoded; identity names the sender.
struct BadMessage : std::runtime_error {
  BadMessage(const std::string& what, zmq::message_t id) : std::runtime_error(what), identity(std::move(id)) {}
  zmq::message_t identity;
};

// ZAP handler: with CURVE on, accepts only clients presenting the configured client public
// key and logs one line for each refusal. Must start before the server socket binds.
class CurveAuthenticator {
 public:
  CurveAuthenticator(zmq::context_t& ctx, const std::string& allowed_client_public_z85, std::string who);
  ~CurveAuthenticator();

 private:
  void Run();
  zmq::socket_t socket_;
  std::string allowed_;  // 32 raw bytes
  std::string who_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// zmq_poll that rides out signals (EINTR) until timeout_ms (-1 = forever) has passed.
int Poll(zmq::pollitem_t* items, size_t n, int timeout_ms);

// Generates a Z85 key pair (public, secret).
std::pair<std::string, std::string> CurveKeyPair();

// Printable form of a ROUTER identity for log lines.
std::string PeerName(const zmq::message_t& identity);

inline msg::DType ToWire(DType t) { return static_cast<msg::DType>(uint16_t(t)); }
inline DType FromWire(msg::DType t) { return static_cast<DType>(uint8_t(t)); }

// Largest frame a server accepts; larger claims are dropped by ZeroMQ before allocation.
constexpr int64_t kMaxFrameBytes = int64_t(4) << 30;

}  // namespace shoal
