#include "common/transport/transport.h"

#include <cstdio>
#include <cstring>
#include <glog/logging.h>
#include <kj/exception.h>
#include <zmq.h>

#include "common/error.h"

namespace shoal {
namespace {

// Cap'n Proto headers are small; these limits make a hostile header cheap to reject.
capnp::ReaderOptions HeaderLimits() {
  capnp::ReaderOptions o;
  o.traversalLimitInWords = 1 << 20;
  o.nestingLimit = 16;
  return o;
}

void ReleasePayload(void* /*data*/, void* hint) {
  auto* p = static_cast<Payload*>(hint);
  if (p->on_release) p->on_release();
  delete p;
}

std::string ProtocolError(int code) {
  switch (code) {
    case ZMQ_PROTOCOL_ERROR_ZMTP_UNEXPECTED_COMMAND:
      return "unexpected ZMTP command";
    case ZMQ_PROTOCOL_ERROR_ZMTP_INVALID_SEQUENCE:
      return "invalid ZMTP sequence";
    case ZMQ_PROTOCOL_ERROR_ZMTP_KEY_EXCHANGE:
      return "key exchange failed";
    case ZMQ_PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH:
      return "security mechanism mismatch (one side uses CURVE, the other not)";
    case ZMQ_PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC:
      return "cryptographic error (wrong keys)";
    default:
      if (code >= ZMQ_PROTOCOL_ERROR_ZMTP_MALFORMED_COMMAND_UNSPECIFIED && code < ZMQ_PROTOCOL_ERROR_ZAP_UNSPECIFIED)
        return "malformed ZMTP command (not a ZeroMQ peer?)";
      if (code >= ZMQ_PROTOCOL_ERROR_ZAP_UNSPECIFIED && code <= ZMQ_PROTOCOL_ERROR_ZAP_INVALID_METADATA)
        return "authentication handler error";
      char buf[64];
      snprintf(buf, sizeof buf, "protocol error 0x%x", code);
      return buf;
  }
}

// A key pair whose halves do not belong together would only show up as refused
// handshakes; say so at startup instead. `need_secret`: this side uses the secret key.
void CheckKeyPair(const std::string& pub, const std::string& secret, const char* who, bool need_secret) {
  uint8_t raw[32];
  std::string where = std::string("[security] ") + who;
  SHOAL_CHECK(pub.size() == 40 && zmq_z85_decode(raw, pub.c_str()) != nullptr,
              where + "_public_key: expected a 40-character Z85 key");
  if (!need_secret) return;
  SHOAL_CHECK(secret.size() == 40 && zmq_z85_decode(raw, secret.c_str()) != nullptr,
              where + "_secret_key: expected a 40-character Z85 key");
  char derived[41];
  SHOAL_CHECK(zmq_curve_public(derived, secret.c_str()) == 0, where + "_secret_key: cannot derive its public key");
  SHOAL_CHECK(pub == derived, where + "_secret_key does not belong to " + who + "_public_key");
}

}  // namespace

void InMessage::ParseHeader(const zmq::message_t& frame) {
  size_t n = frame.size();
  SHOAL_CHECK(n > 0, "empty header frame");
  SHOAL_CHECK(n % sizeof(capnp::word) == 0,
              "header frame of " + std::to_string(n) + " bytes is not whole 8-byte words (truncated?)");
  // Copy: ZeroMQ does not promise 8-byte alignment, which Cap'n Proto needs.
  words_ = kj::heapArray<capnp::word>(n / sizeof(capnp::word));
  memcpy(words_.begin(), frame.data(), n);
  try {
    reader_ = std::make_unique<capnp::FlatArrayMessageReader>(words_.asPtr(), HeaderLimits());
    // Walks every pointer once, so later field reads cannot hit a malformed one.
    reader_->getRoot<msg::Header>().totalSize();
  } catch (const kj::Exception& e) {
    reader_.reset();
    throw Error("header is not a valid Cap'n Proto message: " + std::string(e.getDescription().cStr()));
  }
}

void InMessage::ValidateTensors() const {
  auto metas = header().getTensors();
  SHOAL_CHECK(metas.size() == payloads.size(), "header lists " + std::to_string(metas.size()) + " tensors but " +
                                                   std::to_string(payloads.size()) + " data frames follow");
  for (unsigned i = 0; i < metas.size(); ++i) {
    auto m = metas[i];
    std::string name = m.getName();
    SHOAL_CHECK(!name.empty(), "tensor " + std::to_string(i) + " has an empty name");
    auto dt = m.getDtype();
    SHOAL_CHECK(dt == msg::DType::FP32 || dt == msg::DType::FP16 || dt == msg::DType::BF16,
                "tensor '" + name + "': unknown dtype " + std::to_string(int(dt)));
    uint64_t elems = 1;
    for (int64_t d : m.getShape()) {
      SHOAL_CHECK(d >= 0 && d < (int64_t(1) << 40), "tensor '" + name + "': bad dimension " + std::to_string(d));
      SHOAL_CHECK(d == 0 || elems <= (uint64_t(1) << 44) / uint64_t(d), "tensor '" + name + "': shape too large");
      elems *= uint64_t(d);
    }
    uint64_t want = elems * (dt == msg::DType::FP32 ? 4 : 2);
    SHOAL_CHECK(m.getByteSize() == want, "tensor '" + name + "': byteSize " + std::to_string(m.getByteSize()) +
                                             " does not match its shape and dtype (" + std::to_string(want) + ")");
    SHOAL_CHECK(payloads[i].size() == want, "tensor '" + name + "': data frame has " +
                                                std::to_string(payloads[i].size()) + " bytes, header says " +
                                                std::to_string(want));
  }
}

std::string SocketEvent::Describe() const {
  switch (event) {
    case ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL:
      return "rejected a connection on " + endpoint + ": handshake failed: " + ProtocolError(value);
    case ZMQ_EVENT_HANDSHAKE_FAILED_AUTH:
      return "rejected a connection on " + endpoint + ": authentication refused (status " + std::to_string(value) + ")";
    case ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL:
      return "rejected a connection on " + endpoint + ": handshake did not complete (" + zmq_strerror(value) +
             "): the peer is not a ZeroMQ client with this job's security settings";
    case ZMQ_EVENT_DISCONNECTED:
      return "a peer on " + endpoint + " disconnected; any partly received message from it was discarded";
    default:
      return "socket event " + std::to_string(event) + " on " + endpoint;
  }
}

Transport::Transport(zmq::context_t& ctx, Kind kind, const CurveKeys& keys)
    : ctx_(ctx),
      kind_(kind),
      socket_(ctx, kind == Kind::kServer ? zmq::socket_type::router : zmq::socket_type::dealer) {
  socket_.set(zmq::sockopt::linger, 0);
  // Kernel socket buffers stay at their (auto-tuned) defaults: fixed 4 MiB buffers measured
  // slower on loopback.
  if (kind == Kind::kClient) {
    // A client's own requests are never dropped or blocked; a server keeps ZeroMQ's
    // default high-water marks so one flooding peer meets TCP back-pressure instead of
    // growing the server's memory.
    socket_.set(zmq::sockopt::sndhwm, 0);
    socket_.set(zmq::sockopt::rcvhwm, 0);
  } else {
    socket_.set(zmq::sockopt::maxmsgsize, kMaxFrameBytes);
    socket_.set(zmq::sockopt::router_handover, 1);
  }
  if (keys.enabled()) {
    CheckKeyPair(keys.server_public, keys.server_secret, "server", kind == Kind::kServer);
    CheckKeyPair(keys.client_public, keys.client_secret, "client", kind == Kind::kClient);
    if (kind == Kind::kServer) {
      socket_.set(zmq::sockopt::curve_server, 1);
      socket_.set(zmq::sockopt::curve_secretkey, keys.server_secret);
      socket_.set(zmq::sockopt::zap_domain, "shoal");
    } else {
      socket_.set(zmq::sockopt::curve_serverkey, keys.server_public);
      socket_.set(zmq::sockopt::curve_publickey, keys.client_public);
      socket_.set(zmq::sockopt::curve_secretkey, keys.client_secret);
    }
  }
}

Transport::~Transport() {
  if (monitor_) zmq_socket_monitor(socket_.handle(), nullptr, 0);
}

std::string Transport::Bind(const std::string& endpoint) {
  try {
    socket_.bind(endpoint);
  } catch (const zmq::error_t& e) {
    throw Error("cannot listen on " + endpoint + ": " + e.what());
  }
  return socket_.get(zmq::sockopt::last_endpoint);
}

void Transport::Connect(const std::string& endpoint) {
  try {
    socket_.connect(endpoint);
  } catch (const zmq::error_t& e) {
    throw Error("cannot connect to " + endpoint + ": " + e.what());
  }
}

void Transport::Send(OutMessage& m, const zmq::message_t* to) {
  if (to) {
    zmq::message_t id(to->data(), to->size());
    socket_.send(id, zmq::send_flags::sndmore);
  }
  auto words = capnp::messageToFlatArray(m.builder);
  auto bytes = words.asBytes();
  zmq::message_t head(bytes.begin(), bytes.size());
  bool more = !m.payloads.empty();
  socket_.send(head, more ? zmq::send_flags::sndmore : zmq::send_flags::none);
  bytes_sent_ += bytes.size();
  for (size_t i = 0; i < m.payloads.size(); ++i) {
    Payload& p = m.payloads[i];
    auto flags = i + 1 < m.payloads.size() ? zmq::send_flags::sndmore : zmq::send_flags::none;
    bytes_sent_ += p.size;
    if (p.size == 0) {
      zmq::message_t empty;
      socket_.send(empty, flags);
      if (p.on_release) p.on_release();
      continue;
    }
    auto* hint = new Payload(std::move(p));
    zmq::message_t frame(const_cast<void*>(hint->data), hint->size, &ReleasePayload, hint);
    socket_.send(frame, flags);
  }
  m.payloads.clear();
}

bool Transport::Recv(InMessage* m, int timeout_ms) {
  std::vector<zmq::message_t> frames(1);
  // Try first without waiting: when messages are queued this saves a poll per message.
  if (!socket_.recv(frames[0], zmq::recv_flags::dontwait)) {
    if (timeout_ms == 0) return false;
    zmq::pollitem_t item{socket_.handle(), 0, ZMQ_POLLIN, 0};
    if (Poll(&item, 1, timeout_ms) == 0) return false;
    if (!socket_.recv(frames[0], zmq::recv_flags::dontwait)) return false;
  }
  // A multipart message arrives whole or not at all, so these reads never block.
  while (socket_.get(zmq::sockopt::rcvmore)) {
    frames.emplace_back();
    if (!socket_.recv(frames.back(), zmq::recv_flags::none)) return false;
  }
  size_t first = 0;
  m->identity = zmq::message_t();
  m->payloads.clear();
  if (kind_ == Kind::kServer) m->identity = std::move(frames[first++]);
  try {
    SHOAL_CHECK(first < frames.size(), "message has no header frame");
    m->ParseHeader(frames[first]);
  } catch (const Error& e) {
    zmq::message_t id;
    id.rebuild(m->identity.data(), m->identity.size());
    throw BadMessage(e.what(), std::move(id));
  }
  for (size_t i = first + 1; i < frames.size(); ++i) m->payloads.push_back(std::move(frames[i]));
  return true;
}

void Transport::EnableMonitor() {
  char addr[64];
  snprintf(addr, sizeof addr, "inproc://shoal-monitor-%p", static_cast<void*>(this));
  int events = ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL | ZMQ_EVENT_HANDSHAKE_FAILED_AUTH |
               ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL | ZMQ_EVENT_DISCONNECTED;
  if (zmq_socket_monitor(socket_.handle(), addr, events) != 0)
    throw Error(std::string("cannot monitor socket: ") + zmq_strerror(zmq_errno()));
  monitor_ = std::make_unique<zmq::socket_t>(ctx_, zmq::socket_type::pair);
  monitor_->set(zmq::sockopt::linger, 0);
  monitor_->connect(addr);
}

std::vector<SocketEvent> Transport::DrainEvents() {
  std::vector<SocketEvent> out;
  if (!monitor_) return out;
  while (true) {
    zmq::message_t head, where;
    if (!monitor_->recv(head, zmq::recv_flags::dontwait)) break;
    if (!monitor_->recv(where, zmq::recv_flags::dontwait) || head.size() < 6) continue;
    SocketEvent e;
    uint16_t ev;
    uint32_t val;
    memcpy(&ev, head.data(), 2);
    memcpy(&val, static_cast<const char*>(head.data()) + 2, 4);
    e.event = ev;
    e.value = int(val);
    e.endpoint = where.to_string();
    out.push_back(std::move(e));
  }
  return out;
}

CurveAuthenticator::CurveAuthenticator(zmq::context_t& ctx, const std::string& allowed_z85, std::string who)
    : socket_(ctx, zmq::socket_type::rep), who_(std::move(who)) {
  allowed_.resize(32);
  SHOAL_CHECK(allowed_z85.size() == 40 &&
                  zmq_z85_decode(reinterpret_cast<uint8_t*>(&allowed_[0]), allowed_z85.c_str()) != nullptr,
              "client public key is not a 40-character Z85 key");
  socket_.set(zmq::sockopt::linger, 0);
  socket_.bind("inproc://zeromq.zap.01");
  thread_ = std::thread([this] { Run(); });
}

CurveAuthenticator::~CurveAuthenticator() {
  stop_ = true;
  thread_.join();
}

void CurveAuthenticator::Run() {
  while (!stop_) {
    zmq::pollitem_t item{socket_.handle(), 0, ZMQ_POLLIN, 0};
    if (Poll(&item, 1, 100) == 0) continue;
    std::vector<zmq::message_t> req;
    do {
      req.emplace_back();
      if (!socket_.recv(req.back(), zmq::recv_flags::none)) break;
    } while (socket_.get(zmq::sockopt::rcvmore));
    // ZAP request: version, request id, domain, address, identity, mechanism, credentials.
    bool ok = req.size() >= 7 && req[5].to_string() == "CURVE" && req[6].size() == 32 &&
              memcmp(req[6].data(), allowed_.data(), 32) == 0;
    std::string address = req.size() > 3 ? req[3].to_string() : "?";
    if (!ok) {
      std::string key = "?";
      if (req.size() >= 7 && req[6].size() == 32) {
        char z85[41];
        zmq_z85_encode(z85, static_cast<const uint8_t*>(req[6].data()), 32);
        key = z85;
      }
      LOG(WARNING) << who_ << ": refused CURVE client at " << address << ": public key " << key
                   << " is not the job's client key";
    }
    std::string reqid = req.size() > 1 ? req[1].to_string() : "";
    const char* reply[] = {"1.0", reqid.c_str(), ok ? "200" : "400", ok ? "OK" : "unknown client key", "", ""};
    for (int i = 0; i < 6; ++i) {
      zmq::message_t part(reply[i], i == 1 ? reqid.size() : strlen(reply[i]));
      socket_.send(part, i < 5 ? zmq::send_flags::sndmore : zmq::send_flags::none);
    }
  }
}

int Poll(zmq::pollitem_t* items, size_t n, int timeout_ms) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (true) {
    int rc = zmq_poll(items, int(n), timeout_ms);
    if (rc >= 0) return rc;
    if (zmq_errno() != EINTR) throw Error(std::string("zmq_poll: ") + zmq_strerror(zmq_errno()));
    if (timeout_ms < 0) continue;
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return 0;
    timeout_ms = int(left.count());
  }
}

std::pair<std::string, std::string> CurveKeyPair() {
  char pub[41], sec[41];
  if (zmq_curve_keypair(pub, sec) != 0) throw Error("zmq_curve_keypair failed: this libzmq lacks CURVE support");
  return {pub, sec};
}

std::string PeerName(const zmq::message_t& identity) {
  static const char* hex = "0123456789abcdef";
  std::string s = "peer 0x";
  auto* p = static_cast<const uint8_t*>(identity.data());
  for (size_t i = 0; i < identity.size() && i < 16; ++i) {
    s += hex[p[i] >> 4];
    s += hex[p[i] & 15];
  }
  return s;
}

}  // namespace shoal
