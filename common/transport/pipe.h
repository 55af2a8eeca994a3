// One-way links for the collectives (the ring): a PipeIn binds and receives two-frame
// messages (a small fixed-size header, then a payload) from whoever connects; a PipeOut
// connects to one PipeIn and sends. With keys, a PipeIn admits only the job's client key
// (the context's ZAP handler), like every other socket that binds. Not thread-safe: one
// thread uses a pipe.
#pragma once
#include <atomic>
#include <cstdint>
#include <string>

#include "common/transport/transport.h"

namespace shoal {

struct PipeOptions {
  CurveKeys keys;
  int linger_ms = 10000;  // what was sent still arrives after a close
  // Largest frame a PipeIn accepts; a larger one is hostile: ZeroMQ drops the connection
  // before allocating it. Set it to the largest payload the protocol sends.
  int64_t max_message_bytes = int64_t(64) << 20;
  // Messages a PipeIn queues per connection before ZeroMQ stops reading that connection
  // (TCP back-pressure), so memory stays bounded whoever connects. Sends never block (a
  // PipeOut queues without limit, in the sender's memory), so a bounded receive queue
  // cannot deadlock a protocol whose every message is eventually read.
  int receive_queue_messages = 64;
  int kernel_buffer_bytes = 4 << 20;
};

struct PipeMessage {
  Frame head, body;
};

class PipeIn {
 public:
  PipeIn(TransportContext& ctx, const PipeOptions& o);
  ~PipeIn();
  PipeIn(const PipeIn&) = delete;
  PipeIn& operator=(const PipeIn&) = delete;

  // Binds and returns the resolved endpoint ("tcp://host:*", "ipc://@name").
  std::string Bind(const std::string& endpoint);

  enum class Got { kNothing, kMessage, kMalformed };
  // One whole message if one is queued. kMalformed: a message that is not a `head_bytes`
  // header frame plus one payload frame was read and dropped; *first_frame_bytes says how
  // big its first frame was.
  Got TryRecv(size_t head_bytes, PipeMessage* m, size_t* first_frame_bytes);
  // Waits up to timeout_ms for a message or a connection event.
  void Wait(int timeout_ms);
  // Reads the connection events: connections accepted and still open, and whether any
  // connection was ever accepted.
  void UpdateConnections();
  int open_connections() const { return open_; }
  bool ever_connected() const { return ever_; }
  // Closes now; `abort` drops what is still queued.
  void Close(bool abort);

 private:
  TransportContext& ctx_;
  void* socket_ = nullptr;
  void* monitor_ = nullptr;
  int open_ = 0;
  bool ever_ = false;
};

class PipeOut {
 public:
  PipeOut(TransportContext& ctx, const PipeOptions& o);
  ~PipeOut();
  PipeOut(const PipeOut&) = delete;
  PipeOut& operator=(const PipeOut&) = delete;

  void Connect(const std::string& endpoint);
  // Sends `head` (copied) then the payload. zero_copy: the payload goes to the wire from the
  // caller's memory, which must stay unchanged while in_flight() counts it.
  void Send(const void* head, size_t head_bytes, const void* payload, size_t bytes, bool zero_copy);
  int64_t in_flight() const { return in_flight_.load(); }
  // With keys: why nothing got through since the last successful handshake (the peer
  // refused ours: it holds other keys), naming its address, as " (...)"; else "". Like
  // Transport::RefusalHint.
  std::string RefusalHint();
  void Close(bool abort);

 private:
  void* socket_ = nullptr;
  void* monitor_ = nullptr;  // with keys: handshakes, for RefusalHint
  std::atomic<int64_t> in_flight_{0};
};

}  // namespace shoal
