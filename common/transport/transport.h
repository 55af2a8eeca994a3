// Shoal's messages over ZeroMQ, with ZeroMQ kept inside common/transport/ (nothing else
// includes it). A message is one Cap'n Proto header frame followed by raw tensor frames;
// tensor bytes are handed to ZeroMQ by pointer and received frames stay alive as the
// tensor buffer (Frame), so no layer copies them.
#pragma once
#include <capnp/message.h>
#include <capnp/serialize.h>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "common/messages/schema.capnp.h"

namespace shoal {

// CurveZMQ keys (Z85, 40 characters each). All empty = plaintext.
struct CurveKeys {
  std::string server_public, server_secret;
  std::string client_public, client_secret;
  bool enabled() const { return !server_public.empty(); }
};

// Bytes received off the wire and kept as they arrived (a ZeroMQ frame, no copy), or a
// fresh allocation. Move-only.
class Frame {
 public:
  Frame();
  explicit Frame(size_t size);           // uninitialized bytes
  Frame(const void* data, size_t size);  // a copy
  Frame(Frame&& o) noexcept;
  Frame& operator=(Frame&& o) noexcept;
  Frame(const Frame&) = delete;
  Frame& operator=(const Frame&) = delete;
  ~Frame();
  void* data();
  const void* data() const;
  size_t size() const;
  std::string to_string() const { return std::string(static_cast<const char*>(data()), size()); }
  // Whether the bytes can be read as floats in place (8-byte aligned). ZeroMQ delivers a
  // frame of 34 bytes to 8 KiB at whatever offset of its receive buffer it arrived.
  bool aligned() const { return reinterpret_cast<uintptr_t>(data()) % 8 == 0; }

 private:
  friend struct FrameAccess;
  alignas(8) unsigned char msg_[64];  // a zmq_msg_t
};

// `f` itself when aligned, else an aligned copy of its bytes.
Frame Aligned(Frame&& f);

// Who sent a message to a server socket (a ROUTER identity); empty on client sockets.
using PeerId = std::string;

// A ZeroMQ context and the job's one CurveZMQ authentication path: once a socket of this
// context binds with keys, a ZAP handler admits only peers presenting the job's client
// public key, and logs each refusal (rate-limited, with every bound socket's: see
// RefusedHandshakes). Outlives every socket made in it; its destructor returns only once ZeroMQ has released every
// message sent through it.
class TransportContext {
 public:
  explicit TransportContext(std::string who = "shoal");
  ~TransportContext();
  TransportContext(const TransportContext&) = delete;
  TransportContext& operator=(const TransportContext&) = delete;
  // Starts the ZAP handler for `keys` (once; a second call must name the same client key).
  void Authenticate(const CurveKeys& keys);
  const std::string& who() const { return who_; }
  void* handle() const { return ctx_; }  // for common/transport's own sockets

 private:
  class Authenticator;
  std::string who_;
  void* ctx_;
  std::unique_ptr<Authenticator> auth_;
  std::string allowed_;  // the client key the handler admits
};

// A tensor frame to send. `data` must stay valid until ZeroMQ releases it; `keep` (if
// set) is held until then, and `on_release` runs then (from ZeroMQ's I/O thread), as does
// the decrement of `unreleased` (if set: a count of frames not yet released, without the
// allocation a std::function holding a shared_ptr costs).
struct Payload {
  const void* data = nullptr;
  size_t size = 0;
  std::shared_ptr<const void> keep;
  std::function<void()> on_release;
  std::shared_ptr<std::atomic<int>> unreleased;
};

struct OutMessage {
  OutMessage() = default;
  OutMessage(const OutMessage&) = delete;
  OutMessage& operator=(const OutMessage&) = delete;
  // Headers are a few hundred bytes: the first segment lives inside the message (no
  // allocation per message; Cap'n Proto's default, 8 KiB zeroed, would cost more than the
  // message). Larger headers go on in allocated segments. The builder points into it, so an
  // OutMessage never moves.
  static constexpr size_t kInlineWords = 128;
  alignas(8) unsigned char first_segment[kInlineWords * sizeof(capnp::word)] = {};  // zeroed, as capnp requires
  capnp::MallocMessageBuilder builder{kj::arrayPtr(reinterpret_cast<capnp::word*>(first_segment), kInlineWords)};
  std::vector<Payload> payloads;
  msg::Header::Builder header() { return builder.getRoot<msg::Header>(); }
};

// One tensor entry of a received header, as ValidateTensors read it: the handlers use these
// instead of reading the header's list again (every read walks pointers and counts against
// the traversal limit). Valid until the InMessage decodes its next message.
struct TensorEntry {
  capnp::Text::Reader name;
  msg::DType dtype;
  capnp::List<int64_t>::Reader shape;
  uint64_t byte_size = 0;
  uint64_t version = 0;
  // Copies the shape into *out (reusing its storage).
  void ShapeInto(std::vector<int64_t>* out) const {
    out->resize(shape.size());
    for (unsigned d = 0; d < shape.size(); ++d) (*out)[d] = shape[d];
  }
};

// A received message. The header is parsed from an aligned copy of its (small) frame;
// payload frames are kept as received when 8-byte aligned, else copied to be (unless
// align_payloads is off). An InMessage
// reused for message after message (Recv into the same one) parses without allocating.
class InMessage {
 public:
  InMessage();
  ~InMessage();
  InMessage(InMessage&&) noexcept;
  InMessage& operator=(InMessage&&) noexcept;
  PeerId identity;  // the sender, on server sockets
  std::vector<Frame> payloads;
  // Decode copies a payload frame that is not 8-byte aligned, so that it can be read as
  // floats in place. A receiver that aligns only what it reads as floats (Aligned) sets this
  // false and keeps every frame as received: the PS client's pulled tensors (only ever
  // copied out), the shard's pushed ones (KvShard aligns what its update rules read).
  bool align_payloads = true;
  // The root, read once when parsed: every handler asks for it several times, and each
  // getRoot is a bounds-checked pointer read that counts against the traversal limit.
  msg::Header::Reader header() const { return root_; }
  bool has_header() const;
  // Parses `frame` as the header; throws shoal::Error saying what is wrong with it.
  void ParseHeader(const Frame& frame);
  // Checks that the tensor metas match the frames (count, byte sizes, dtype x shape), and
  // returns them, read once (entry i describes payloads[i]).
  const std::vector<TensorEntry>& ValidateTensors();
  // Takes one received multipart message apart: on server sockets (`with_identity`) the
  // first frame is the sender, then the header, then the payloads. What Recv does with
  // every message, public so the decoder can be tested (and fuzzed) without sockets.
  // Throws BadMessage naming the sender.
  void Decode(std::vector<Frame>&& frames, bool with_identity);
  // Decode once the frames are in place: the sender (`from`, server sockets; else nullptr)
  // and the header (nullptr: the message had none) as received, the payload frames already
  // in `payloads`. Transport::Recv receives straight into these, with no frames to move.
  void Accept(const Frame* from, const Frame* header);

 private:
  void ResetHeader();                 // forgets the last message's header (and what was read from it)
  struct Parsed;                      // the header's aligned copy and its reader, kept for the next message
  std::unique_ptr<Parsed> parsed_;    // heap: moves keep root_ valid
  msg::Header::Reader root_;          // points into *parsed_
  std::vector<TensorEntry> tensors_;  // ValidateTensors', kept for the next message
};

// Connection events reported by the socket monitor (handshake failures, disconnects).
struct SocketEvent {
  int event = 0;
  int value = 0;
  std::string endpoint;
  std::string Describe() const;  // one line, e.g. "handshake failed: ..."
  bool is_disconnect() const;
};

class Transport {
 public:
  enum class Kind { kServer, kClient };  // ROUTER (bind) | DEALER (connect)
  // A server socket with keys turns on the context's client authentication.
  Transport(TransportContext& ctx, Kind kind, const CurveKeys& keys);
  ~Transport();
  Transport(const Transport&) = delete;
  Transport& operator=(const Transport&) = delete;

  // Binds and returns the resolved endpoint (so "tcp://127.0.0.1:*" works).
  std::string Bind(const std::string& endpoint);
  void Connect(const std::string& endpoint);
  // Largest message a server socket accepts (default kMaxFrameBytes); set before Bind.
  void SetMaxMessageBytes(int64_t bytes);
  // Messages queued for an unreachable peer before sends drop (heartbeats); default none.
  void SetSendQueue(int messages);
  // Sends header + payloads; `to` is the peer identity on a server socket.
  void Send(OutMessage& m, const PeerId* to = nullptr);
  // Sends a payload-free message unless the queue is full; false when dropped.
  bool TrySend(OutMessage& m);
  // Receives one whole message, waiting at most timeout_ms (-1 = forever); false on
  // timeout. A frame sequence that is not a valid message throws BadMessage.
  bool Recv(InMessage* m, int timeout_ms);

  // Waits up to timeout_ms for a message; false when none came. The monitor's events are not
  // waited for: a second socket in every poll costs a busy server more than a thousand
  // instructions per message, so its owner drains them between messages (DrainEvents).
  // Right after a Recv that found nothing it sleeps in one poll(2) on the socket's ZMQ_FD
  // (see drained_), where zmq_poll made three more system calls per wait.
  bool Wait(int timeout_ms);
  // Reports handshake failures and disconnects through DrainEvents(). A client, and a
  // socket with keys, has it on from the start (so RefusalHint always works on a client, and a server's
  // refusals are logged); a plaintext server may turn it on.
  void EnableMonitor();
  // The monitor's events since the last call. On a server the refused handshakes go to the
  // refusal log instead (see RefusedHandshakes); a keyed server's owner calls this often.
  std::vector<SocketEvent> DrainEvents();
  // For a client's "no answer" error: with the monitor on, why the connection never carried
  // a message since the last successful handshake (a refused handshake: the peer holds
  // other keys, or without keys is no ZeroMQ service at all), naming the peer's address,
  // as " (...)"; else "". Drains the events.
  std::string RefusalHint();

  Kind kind() const { return kind_; }
  uint64_t bytes_sent() const { return bytes_sent_; }

 private:
  friend bool WaitAny(const std::vector<Transport*>& ts, int timeout_ms, std::vector<char>* ready);
  // Whether a message can be read now (ZMQ_EVENTS, which handles ZeroMQ's pending commands
  // first); false also marks the socket drained.
  bool Readable();
  // Wait and WaitAny: sets ready[i] for each of the n sockets that has a message.
  static bool WaitSockets(Transport* const* ts, size_t n, int timeout_ms, char* ready);
  TransportContext& ctx_;
  Kind kind_;
  void* socket_ = nullptr;
  int fd_ = -1;  // ZMQ_FD: readable when ZeroMQ has commands for this socket, e.g. "a message came"
  // The last call on the socket found no message and handled every pending command (a
  // non-blocking receive that failed, or Readable() false), so ZMQ_FD turns readable with
  // the next arrival and a wait may go straight to poll(2). Any other call on the socket (a
  // send, a connect) may take that signal while a message arrives, so it clears this.
  bool drained_ = false;
  void* monitor_ = nullptr;
  bool keyed_ = false;            // CURVE: a refused handshake may mean other keys
  int64_t refused_unclosed_ = 0;  // servers: refused connections whose disconnect is to come
  uint64_t bytes_sent_ = 0;
  Frame identity_, header_;  // Recv's first frames, received into afresh for every message
};

// Waits up to timeout_ms until one of `ts` has a message; (*ready)[i] says which. False on
// timeout.
bool WaitAny(const std::vector<Transport*>& ts, int timeout_ms, std::vector<char>* ready);

// Thrown by Recv for a message that cannot be decoded; identity names the sender.
struct BadMessage : std::runtime_error {
  BadMessage(const std::string& what, PeerId id) : std::runtime_error(what), identity(std::move(id)) {}
  PeerId identity;
};

// "host:port" -> the endpoint to bind: loopback stays loopback, anything else listens on all
// interfaces (the host's name may not be one of its interface addresses).
std::string ListenEndpoint(const std::string& host_port);
// Where peers reach a socket bound at ListenEndpoint(host + ":*"): "tcp://host:PORT", PORT
// taken from `bound` (what Bind returned, e.g. "tcp://0.0.0.0:41233"). A host given by name
// ("localhost", "node3") cannot be bound, only connected to.
std::string ReachableEndpoint(const std::string& host, const std::string& bound);

// The handshakes this process's keyed bound sockets refused so far (every context's: rank
// 0's coordinator and its own rendezvous client are different ones), for a bound side's
// "no value / nobody came" errors: " (3 handshake(s) from 10.0.0.7 were refused: other
// [security] keys?)", or "" when none was. Each refusal is also logged, rate-limited.
std::string RefusedHandshakes();

// Generates a Z85 key pair (public, secret).
std::pair<std::string, std::string> CurveKeyPair();

// Printable form of a server socket's peer identity for log lines.
std::string PeerName(const PeerId& identity);

// The error for an answer of the wrong kind from `who` at `address` ("shard 1",
// "127.0.0.1:7701") to a request of kind `asked`: names both kinds, and says when the answer
// is the request itself come back, which means something else listens there (a TCP echo
// service completes ZeroMQ's handshake with the client's own greeting).
std::string UnexpectedAnswer(const std::string& who, const std::string& address, msg::Kind asked, msg::Kind got);

inline msg::DType ToWire(DType t) { return static_cast<msg::DType>(uint16_t(t)); }
inline DType FromWire(msg::DType t) { return static_cast<DType>(uint8_t(t)); }

// Largest frame a server accepts; larger claims are dropped by ZeroMQ before allocation.
constexpr int64_t kMaxFrameBytes = int64_t(4) << 30;

// Largest header frame any socket parses. A header costs about 100 bytes per tensor entry
// (name, dtype, shape), so this admits requests naming well over 100,000 tensors, while
// a hostile multi-GiB "header" is refused before it is copied or parsed.
constexpr size_t kMaxHeaderBytes = size_t(16) << 20;

}  // namespace shoal
