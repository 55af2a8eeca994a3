// Inside common/transport only: what the files that talk to ZeroMQ directly
// (transport.cc, pipe.cc) share: the zmq_msg_t a Frame holds and small socket helpers.
#pragma once
#include <zmq.h>

#include <cstdint>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/transport/transport.h"

namespace shoal {

static_assert(sizeof(zmq_msg_t) == 64, "Frame reserves 64 bytes for a zmq_msg_t");

struct FrameAccess {
  static zmq_msg_t* Msg(Frame& f) { return reinterpret_cast<zmq_msg_t*>(f.msg_); }
  static zmq_msg_t* Msg(const Frame& f) { return reinterpret_cast<zmq_msg_t*>(const_cast<unsigned char*>(f.msg_)); }
};

namespace zmqi {

inline std::string Error(const std::string& what) { return what + ": " + zmq_strerror(zmq_errno()); }

inline void SetInt(void* s, int opt, int v, const char* what) {
  if (zmq_setsockopt(s, opt, &v, sizeof v) != 0) throw shoal::Error(Error(std::string("socket option ") + what));
}

// ZeroMQ checks ZMQ_MAXMSGSIZE against a frame as it arrives on the wire, and with CURVE that
// is the encrypted MESSAGE command: "\x07MESSAGE" (8 bytes), a nonce (8), flags (1) and the
// MAC (16) around the payload. A limit that is exact for the payload would refuse every
// full-sized frame of a keyed link, and ZeroMQ drops the whole connection when it does.
constexpr int64_t kCurveFrameOverhead = 8 + 8 + 1 + 16;

// Admits frames of up to `payload_bytes` (plus CURVE's envelope when `keyed`).
inline void SetMaxFrameBytes(void* s, int64_t payload_bytes, bool keyed) {
  int64_t limit = payload_bytes + (keyed ? kCurveFrameOverhead : 0);
  if (zmq_setsockopt(s, ZMQ_MAXMSGSIZE, &limit, sizeof limit) != 0)
    throw shoal::Error(Error("socket option maxmsgsize"));
}

inline bool RcvMore(void* s) {
  int more = 0;
  size_t len = sizeof more;
  zmq_getsockopt(s, ZMQ_RCVMORE, &more, &len);
  return more != 0;
}

// Binds and returns the endpoint ZeroMQ resolved (a "*" port filled in).
inline std::string Bind(void* s, const std::string& endpoint) {
  if (zmq_bind(s, endpoint.c_str()) != 0) throw shoal::Error(Error("cannot listen on " + endpoint));
  char ep[256];
  size_t len = sizeof ep;
  if (zmq_getsockopt(s, ZMQ_LAST_ENDPOINT, ep, &len) != 0) throw shoal::Error(Error("last endpoint"));
  return ep;
}

// ZeroMQ's monitor for socket `s`: returns the PAIR socket its `events` (ZMQ_EVENT_* mask)
// arrive on. The read end queues without limit, so events nobody reads never block the I/O
// thread reporting them (they are few: a couple per connection attempt).
void* StartMonitor(void* ctx, void* s, int events);
// Stops the monitor and closes its socket (a no-op when *monitor is null).
void StopMonitor(void* s, void** monitor);
// Every event queued on a monitor socket, oldest first.
std::vector<SocketEvent> DrainMonitor(void* monitor);
// The ways a handshake fails (each ZMQ_EVENT_* is one bit): a refusal, on either side.
constexpr int kHandshakeFailedEvents =
    ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL | ZMQ_EVENT_HANDSHAKE_FAILED_AUTH | ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL;
// The events a client socket's monitor reports: its connection attempts' handshakes and
// disconnects. What RefusalHint reads.
constexpr int kClientEvents = ZMQ_EVENT_HANDSHAKE_SUCCEEDED | kHandshakeFailedEvents | ZMQ_EVENT_DISCONNECTED;
// Bound sockets: moves the handshake failures out of `events` into the process's refusal
// log (logged rate-limited for `who`, counted for RefusedHandshakes), leaving the rest.
// With `unclosed` (the socket's count of refused connections whose disconnect is still to
// come, kept across calls), the disconnects of refused connections go too.
void NoteRefusals(const std::string& who, std::vector<SocketEvent>* events, int64_t* unclosed);
// RefusalHint's text for a client socket's events (see Transport::RefusalHint).
// `keyed`: the socket uses CURVE, so a failed handshake may be other keys; without keys
// it means the peer is not a ZeroMQ service (a web server, say).
std::string RefusalHint(const std::vector<SocketEvent>& events, bool keyed);

}  // namespace zmqi
}  // namespace shoal
