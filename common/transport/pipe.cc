#include "common/transport/pipe.h"

#include <zmq.h>

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "common/error.h"
#include "common/transport/zmq_internal.h"

namespace shoal {

namespace {

using zmqi::RcvMore;
std::string ZmqError(const std::string& what) { return zmqi::Error(what); }

// Best effort: every option set here has a valid value.
void SetInt(void* s, int opt, int v) { zmq_setsockopt(s, opt, &v, sizeof v); }

// Options both ends share: sends never block (no send high-water mark), receives queue a
// bounded number of messages, large kernel buffers, linger so what was sent still arrives
// after a close.
void* MakeSocket(TransportContext& ctx, int type, const PipeOptions& o) {
  void* s = zmq_socket(ctx.handle(), type);
  if (!s) throw Error(ZmqError("pipe: cannot create a socket"));
  SetInt(s, ZMQ_SNDHWM, 0);
  SetInt(s, ZMQ_RCVHWM, std::max(1, o.receive_queue_messages));
  SetInt(s, ZMQ_SNDBUF, o.kernel_buffer_bytes);
  SetInt(s, ZMQ_RCVBUF, o.kernel_buffer_bytes);
  SetInt(s, ZMQ_LINGER, o.linger_ms);
  return s;
}

void CurveOption(void* s, int opt, const std::string& key, const char* what) {
  if (zmq_setsockopt(s, opt, key.c_str(), key.size()) != 0) {
    zmq_close(s);
    throw Error(ZmqError(std::string("pipe: CURVE ") + what));
  }
}

void Release(void*, void* hint) { static_cast<std::atomic<int64_t>*>(hint)->fetch_sub(1); }

void CloseSocket(void*& s, bool abort) {
  if (!s) return;
  if (abort) SetInt(s, ZMQ_LINGER, 0);
  zmq_close(s);
  s = nullptr;
}

}  // namespace

PipeIn::PipeIn(TransportContext& ctx, const PipeOptions& o) : ctx_(ctx) {
  if (o.keys.enabled()) ctx.Authenticate(o.keys);
  socket_ = MakeSocket(ctx, ZMQ_PULL, o);
  try {
    zmqi::SetMaxFrameBytes(socket_, o.max_message_bytes, o.keys.enabled());
  } catch (...) {
    zmq_close(socket_);
    throw;
  }
  if (o.keys.enabled()) {
    SetInt(socket_, ZMQ_CURVE_SERVER, 1);
    CurveOption(socket_, ZMQ_CURVE_SECRETKEY, o.keys.server_secret, "server secret key");
    CurveOption(socket_, ZMQ_ZAP_DOMAIN, "shoal", "ZAP domain");
  }
  // Its refused handshakes (with keys) go to the refusal log, in UpdateConnections.
  int events = ZMQ_EVENT_ACCEPTED | ZMQ_EVENT_DISCONNECTED | zmqi::kHandshakeFailedEvents;
  try {
    monitor_ = zmqi::StartMonitor(ctx.handle(), socket_, events);
  } catch (...) {
    zmq_close(socket_);
    throw;
  }
}

PipeIn::~PipeIn() { Close(false); }

void PipeIn::Close(bool abort) {
  if (socket_) zmqi::StopMonitor(socket_, &monitor_);
  CloseSocket(socket_, abort);
}

std::string PipeIn::Bind(const std::string& endpoint) { return zmqi::Bind(socket_, endpoint); }

PipeIn::Got PipeIn::TryRecv(size_t head_bytes, PipeMessage* m, size_t* first_frame_bytes) {
  if (zmq_msg_recv(FrameAccess::Msg(m->head), socket_, ZMQ_DONTWAIT) < 0) return Got::kNothing;
  // Multipart messages arrive whole, so the reads below never block.
  bool ok = m->head.size() == head_bytes && RcvMore(socket_);
  if (ok) {
    zmq_msg_recv(FrameAccess::Msg(m->body), socket_, 0);
    ok = !RcvMore(socket_);
  }
  if (ok) return Got::kMessage;
  *first_frame_bytes = m->head.size();
  while (RcvMore(socket_)) {  // drop the rest of the bad message
    Frame junk;
    zmq_msg_recv(FrameAccess::Msg(junk), socket_, 0);
  }
  return Got::kMalformed;
}

void PipeIn::Wait(int timeout_ms) {
  zmq_pollitem_t items[] = {{socket_, 0, ZMQ_POLLIN, 0}, {monitor_, 0, ZMQ_POLLIN, 0}};
  if (zmq_poll(items, 2, timeout_ms) < 0 && zmq_errno() != EINTR) throw Error(ZmqError("pipe: poll"));
}

void PipeIn::UpdateConnections() {
  std::vector<SocketEvent> events = zmqi::DrainMonitor(monitor_);
  zmqi::NoteRefusals(ctx_.who(), &events, nullptr);  // its disconnects count connections
  for (const SocketEvent& e : events) {
    if (e.event == ZMQ_EVENT_ACCEPTED) {
      ++open_;
      ever_ = true;
    }
    if (e.event == ZMQ_EVENT_DISCONNECTED && open_ > 0) --open_;
  }
}

PipeOut::PipeOut(TransportContext& ctx, const PipeOptions& o) {
  socket_ = MakeSocket(ctx, ZMQ_PUSH, o);
  if (o.keys.enabled()) {
    CurveOption(socket_, ZMQ_CURVE_SERVERKEY, o.keys.server_public, "server public key");
    CurveOption(socket_, ZMQ_CURVE_PUBLICKEY, o.keys.client_public, "client public key");
    CurveOption(socket_, ZMQ_CURVE_SECRETKEY, o.keys.client_secret, "client secret key");
    try {
      monitor_ = zmqi::StartMonitor(ctx.handle(), socket_, zmqi::kClientEvents);
    } catch (...) {
      zmq_close(socket_);
      throw;
    }
  }
}

PipeOut::~PipeOut() { Close(false); }

void PipeOut::Close(bool abort) {
  if (socket_) zmqi::StopMonitor(socket_, &monitor_);
  CloseSocket(socket_, abort);
}

std::string PipeOut::RefusalHint() { return zmqi::RefusalHint(zmqi::DrainMonitor(monitor_), /*keyed=*/true); }

void PipeOut::Connect(const std::string& endpoint) {
  if (zmq_connect(socket_, endpoint.c_str()) != 0) throw Error(ZmqError("connect to " + endpoint));
}

void PipeOut::Send(const void* head, size_t head_bytes, const void* payload, size_t bytes, bool zero_copy) {
  while (zmq_send(socket_, head, head_bytes, ZMQ_SNDMORE) < 0)
    if (zmq_errno() != EINTR) throw Error(ZmqError("pipe send"));
  zmq_msg_t m;
  if (zero_copy && bytes > 0) {
    in_flight_.fetch_add(1);
    zmq_msg_init_data(&m, const_cast<void*>(payload), bytes, Release, &in_flight_);
  } else {
    zmq_msg_init_size(&m, bytes);
    if (bytes) memcpy(zmq_msg_data(&m), payload, bytes);
  }
  while (zmq_msg_send(&m, socket_, 0) < 0) {
    if (zmq_errno() != EINTR) {
      zmq_msg_close(&m);
      throw Error(ZmqError("pipe send"));
    }
  }
}

}  // namespace shoal
