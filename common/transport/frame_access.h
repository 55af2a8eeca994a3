// Inside common/transport only: the zmq_msg_t a Frame holds, for the files that talk to
// ZeroMQ directly (transport.cc, pipe.cc).
#pragma once
#include <zmq.h>

#include "common/transport/transport.h"

namespace shoal {

static_assert(sizeof(zmq_msg_t) == 64, "Frame reserves 64 bytes for a zmq_msg_t");

struct FrameAccess {
  static zmq_msg_t* Msg(Frame& f) { return reinterpret_cast<zmq_msg_t*>(f.msg_); }
  static zmq_msg_t* Msg(const Frame& f) { return reinterpret_cast<zmq_msg_t*>(const_cast<unsigned char*>(f.msg_)); }
};

}  // namespace shoal
