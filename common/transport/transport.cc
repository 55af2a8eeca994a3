#include "common/transport/transport.h"

#include <zmq.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <glog/logging.h>
#include <capnp/schema.h>
#include <kj/exception.h>
#include <malloc.h>
#include <map>
#include <mutex>
#include <optional>
#include <poll.h>
#include <thread>

#include "common/error.h"
#include "common/transport/zmq_internal.h"

namespace shoal {

namespace {

using Clock = std::chrono::steady_clock;

using zmqi::RcvMore;
using zmqi::SetInt;
std::string ZmqError(const std::string& what) { return zmqi::Error(what); }

void SetStr(void* s, int opt, const std::string& v, const char* what) {
  if (zmq_setsockopt(s, opt, v.data(), v.size()) != 0) throw Error(ZmqError(std::string("socket option ") + what));
}

// Sends one frame, riding out EINTR; false when ZMQ_DONTWAIT found the queue full.
bool SendFrame(void* s, zmq_msg_t* m, int flags) {
  while (zmq_msg_send(m, s, flags) < 0) {
    if (zmq_errno() == EINTR) continue;
    if (zmq_errno() == EAGAIN && (flags & ZMQ_DONTWAIT)) return false;
    throw Error(ZmqError("send"));
  }
  return true;
}

bool SendCopy(void* s, const void* data, size_t n, int flags) {
  zmq_msg_t m;
  zmq_msg_init_size(&m, n);
  if (n) memcpy(zmq_msg_data(&m), data, n);
  try {
    bool sent = SendFrame(s, &m, flags);
    if (!sent) zmq_msg_close(&m);
    return sent;
  } catch (...) {
    zmq_msg_close(&m);
    throw;
  }
}

// Cap'n Proto's traversal limit guards against amplification (many pointers to the same
// bytes). A header without it reads each of its words at most once per walk, so the
// validation walk may read no more than the frame holds; after it, readers get room for
// kHeaderReadPasses walks, since handlers read the same lists more than once.
constexpr uint64_t kHeaderReadPasses = 64;
// Every header() call re-reads the root struct: small messages get a floor for that.
constexpr uint64_t kHeaderReadFloor = uint64_t(1) << 16;
// A received header's copy is kept for the next one: room for the usual few hundred bytes,
// and no more than kKeptHeaderWords kept after a large one (a registration of many tensors).
constexpr size_t kMinHeaderCopyWords = 64;
constexpr size_t kKeptHeaderWords = 8192;

capnp::ReaderOptions HeaderLimits(uint64_t traversal_words) {
  capnp::ReaderOptions o;
  o.traversalLimitInWords = traversal_words;
  o.nestingLimit = 16;
  return o;
}

// Serializes a header straight into the frame ZeroMQ sends, in Cap'n Proto's flat-array
// format (segment count - 1, each segment's size in words, padding to a word, then the
// segments), instead of into a temporary array that would be copied again. Returns the
// frame's size.
size_t InitHeaderFrame(zmq_msg_t* m, capnp::MessageBuilder& builder) {
  auto segments = builder.getSegmentsForOutput();
  const size_t table_words = segments.size() / 2 + 1;
  size_t words = table_words;
  for (auto& seg : segments) words += seg.size();
  if (zmq_msg_init_size(m, words * sizeof(capnp::word)) != 0) throw Error(ZmqError("header frame"));
  auto* out = static_cast<unsigned char*>(zmq_msg_data(m));
  memset(out, 0, table_words * sizeof(capnp::word));
  uint32_t n = uint32_t(segments.size() - 1);
  memcpy(out, &n, 4);
  for (size_t i = 0; i < segments.size(); ++i) {
    uint32_t size = uint32_t(segments[i].size());
    memcpy(out + 4 * (i + 1), &size, 4);
  }
  out += table_words * sizeof(capnp::word);
  for (auto& seg : segments) {
    memcpy(out, seg.begin(), seg.size() * sizeof(capnp::word));
    out += seg.size() * sizeof(capnp::word);
  }
  return words * sizeof(capnp::word);
}

void ReleasePayload(void* /*data*/, void* hint) {
  auto* p = static_cast<Payload*>(hint);
  if (p->on_release) p->on_release();
  if (p->unreleased) --*p->unreleased;
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

// Every refused handshake on a bound socket of this process, whichever context or role:
// one place that logs them and remembers them for the bound side's timeout messages. A
// peer retrying every 100 ms must neither flood the log nor grow memory: each (role, peer)
// gets its first refusal logged in full, then one count line at most every
// kCountEverySeconds; at most kMaxPeers are told apart, the rest share one entry.
class RefusalLog {
 public:
  static RefusalLog& Get() {
    static RefusalLog* log = new RefusalLog;  // never destroyed: sockets may outlive statics
    return *log;
  }

  void Record(const std::string& who, const std::string& from, const std::string& line) {
    constexpr int kCountEverySeconds = 10;
    constexpr size_t kMaxPeers = 64;
    std::lock_guard<std::mutex> lock(mu_);
    auto key = std::make_pair(who, from);
    if (!peers_.count(key) && peers_.size() >= kMaxPeers) key = {who, "other peers"};
    Peer& p = peers_[key];
    auto now = Clock::now();
    if (p.total++ == 0) {
      p.logged = now;
      LOG(WARNING) << who << ": " << line << " (refused handshakes from " << key.second << " are counted from now on, "
                   << "a line every " << kCountEverySeconds << " s)";
      return;
    }
    ++p.unlogged;
    if (now - p.logged < std::chrono::seconds(kCountEverySeconds)) return;
    LOG(WARNING) << who << ": " << p.unlogged << " more handshake(s) from " << key.second << " refused in the last "
                 << std::chrono::duration_cast<std::chrono::seconds>(now - p.logged).count() << " s (" << p.total
                 << " in all; other [security] keys?)";
    p.unlogged = 0;
    p.logged = now;
  }

  std::string Summary() {
    std::lock_guard<std::mutex> lock(mu_);
    std::map<std::string, int64_t> by_peer;  // the roles of one process share a peer's count
    for (const auto& [key, p] : peers_) by_peer[key.second] += p.total;
    std::string out;
    for (const auto& [from, n] : by_peer) {
      out += out.empty() ? " (" : "; ";
      out += std::to_string(n) + " handshake(s) from " + from + " were refused";
    }
    return out.empty() ? "" : out + ": other [security] keys?)";
  }

 private:
  struct Peer {
    int64_t total = 0, unlogged = 0;
    Clock::time_point logged;
  };
  std::mutex mu_;
  std::map<std::pair<std::string, std::string>, Peer> peers_;
};

// ZeroMQ mallocs each received frame above its 8 KiB batch buffer, and a pulled tensor or
// pushed gradient is freed a step later. Under glibc's default policy such frames are
// unmapped, or trimmed off the heap, when freed, so the next one faults in and zeroes every
// page again: a 1 MiB push+pull on loopback took 1.4 ms instead of 0.9 (some 115 faults per
// frame) in whichever process had drifted into that state. These are the thresholds glibc
// itself moves to once it has freed a 32 MiB frame: frames up to 32 MiB reuse heap memory,
// and up to 64 MiB of free heap top stays mapped. A user's own malloc settings win.
void KeepFreedFramesMapped() {
  static std::once_flag once;
  std::call_once(once, [] {
    const char* tunables = getenv("GLIBC_TUNABLES");
    if (getenv("MALLOC_MMAP_THRESHOLD_") || getenv("MALLOC_TRIM_THRESHOLD_") ||
        (tunables && strstr(tunables, "glibc.malloc.")))
      return;
    mallopt(M_MMAP_THRESHOLD, 32 << 20);
    mallopt(M_TRIM_THRESHOLD, 64 << 20);
  });
}

}  // namespace

std::string RefusedHandshakes() { return RefusalLog::Get().Summary(); }

Frame::Frame() { zmq_msg_init(FrameAccess::Msg(*this)); }
Frame::Frame(size_t size) {
  if (zmq_msg_init_size(FrameAccess::Msg(*this), size) != 0) throw std::bad_alloc();
}
Frame::Frame(const void* data, size_t size) : Frame(size) {
  if (size) memcpy(this->data(), data, size);
}
Frame::Frame(Frame&& o) noexcept {
  zmq_msg_init(FrameAccess::Msg(*this));
  zmq_msg_move(FrameAccess::Msg(*this), FrameAccess::Msg(o));
}
Frame& Frame::operator=(Frame&& o) noexcept {
  if (this != &o) zmq_msg_move(FrameAccess::Msg(*this), FrameAccess::Msg(o));
  return *this;
}
Frame::~Frame() { zmq_msg_close(FrameAccess::Msg(*this)); }
void* Frame::data() { return zmq_msg_data(FrameAccess::Msg(*this)); }
const void* Frame::data() const { return zmq_msg_data(FrameAccess::Msg(*this)); }
size_t Frame::size() const { return zmq_msg_size(FrameAccess::Msg(*this)); }

Frame Aligned(Frame&& f) {
  if (f.aligned()) return std::move(f);
  return Frame(f.data(), f.size());  // ZeroMQ's own allocation: 8-byte aligned
}

struct InMessage::Parsed {
  kj::Array<capnp::word> words;  // the next header is copied into it (see kKeptHeaderWords)
  std::optional<capnp::FlatArrayMessageReader> reader;
};

InMessage::InMessage() = default;
InMessage::~InMessage() = default;
InMessage::InMessage(InMessage&&) noexcept = default;
InMessage& InMessage::operator=(InMessage&&) noexcept = default;

bool InMessage::has_header() const { return parsed_ && parsed_->reader; }

void InMessage::ResetHeader() {
  root_ = msg::Header::Reader();
  tensors_.clear();
  if (parsed_) parsed_->reader.reset();
}

void InMessage::ParseHeader(const Frame& frame) {
  ResetHeader();
  size_t n = frame.size();
  SHOAL_CHECK(n > 0, "empty header frame");
  SHOAL_CHECK(n <= kMaxHeaderBytes, "header frame of " + std::to_string(n) + " bytes exceeds the limit of " +
                                        std::to_string(kMaxHeaderBytes) + " bytes (kMaxHeaderBytes)");
  SHOAL_CHECK(n % sizeof(capnp::word) == 0,
              "header frame of " + std::to_string(n) + " bytes is not whole 8-byte words (truncated?)");
  const uint64_t words = n / sizeof(capnp::word);
  if (!parsed_) parsed_ = std::make_unique<Parsed>();
  Parsed& p = *parsed_;
  // Copy: ZeroMQ does not promise 8-byte alignment, which Cap'n Proto needs.
  if (p.words.size() < words || (p.words.size() > kKeptHeaderWords && words <= kKeptHeaderWords))
    p.words = kj::heapArray<capnp::word>(std::max<size_t>(words, kMinHeaderCopyWords));
  memcpy(p.words.begin(), frame.data(), n);
  auto bytes = p.words.slice(0, words).asConst();
  try {
    // Walks every pointer once, so later field reads cannot hit a malformed one. Budget: the
    // walk (at most the frame's words) plus reading the root as a Header (its struct, again
    // within the frame), so an amplifying header is refused here, not halfway through a
    // handler.
    // (The root is read as a Header once, below, by the reader that keeps it.)
    capnp::FlatArrayMessageReader check(bytes, HeaderLimits(2 * words));
    check.getRoot<capnp::AnyPointer>().targetSize();
    p.reader.emplace(bytes, HeaderLimits(words * kHeaderReadPasses + kHeaderReadFloor));
    root_ = p.reader->getRoot<msg::Header>();
  } catch (const kj::Exception& e) {
    root_ = msg::Header::Reader();
    p.reader.reset();
    throw Error("header is not a valid Cap'n Proto message: " + std::string(e.getDescription().cStr()));
  }
}

const std::vector<TensorEntry>& InMessage::ValidateTensors() {
  tensors_.clear();
  auto metas = header().getTensors();
  SHOAL_CHECK(metas.size() == payloads.size(), "header lists " + std::to_string(metas.size()) + " tensors but " +
                                                   std::to_string(payloads.size()) + " data frames follow");
  tensors_.resize(metas.size());
  for (unsigned i = 0; i < metas.size(); ++i) {
    auto m = metas[i];
    // Read in place; a std::string is made only for an error message.
    capnp::Text::Reader name = m.getName();
    SHOAL_CHECK(name.size() > 0, "tensor " + std::to_string(i) + " has an empty name");
    auto dt = m.getDtype();
    SHOAL_CHECK(dt == msg::DType::FP32 || dt == msg::DType::FP16 || dt == msg::DType::BF16,
                "tensor '" + std::string(name) + "': unknown dtype " + std::to_string(int(dt)));
    // The checkpoint loader's limits: a tensor accepted here must be loadable again.
    auto dims = m.getShape();  // read once: each getter re-checks the pointer
    SHOAL_CHECK(dims.size() <= kMaxTensorDims, "tensor '" + std::string(name) + "': " + std::to_string(dims.size()) +
                                                   " dimensions (at most " + std::to_string(kMaxTensorDims) + ")");
    uint64_t elems = 1;
    for (int64_t d : dims) {
      SHOAL_CHECK(d >= 0 && d < kMaxTensorDimSize,
                  "tensor '" + std::string(name) + "': bad dimension " + std::to_string(d));
      SHOAL_CHECK(d == 0 || elems <= (uint64_t(1) << 44) / uint64_t(d),
                  "tensor '" + std::string(name) + "': shape too large");
      elems *= uint64_t(d);
    }
    uint64_t want = elems * (dt == msg::DType::FP32 ? 4 : 2);
    const uint64_t byte_size = m.getByteSize();
    SHOAL_CHECK(byte_size == want, "tensor '" + std::string(name) + "': byteSize " + std::to_string(byte_size) +
                                       " does not match its shape and dtype (" + std::to_string(want) + ")");
    SHOAL_CHECK(payloads[i].size() == want, "tensor '" + std::string(name) + "': data frame has " +
                                                std::to_string(payloads[i].size()) + " bytes, header says " +
                                                std::to_string(want));
    tensors_[i] = {name, dt, dims, byte_size, m.getVersion()};
  }
  return tensors_;
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
    case ZMQ_EVENT_HANDSHAKE_SUCCEEDED:
      return "handshake succeeded on " + endpoint;
    case ZMQ_EVENT_DISCONNECTED:
      return "a peer on " + endpoint + " disconnected; any partly received message from it was discarded";
    default:
      return "socket event " + std::to_string(event) + " on " + endpoint;
  }
}

bool SocketEvent::is_disconnect() const { return event == ZMQ_EVENT_DISCONNECTED; }

// ZAP handler: admits only CURVE clients presenting the allowed public key.
class TransportContext::Authenticator {
 public:
  Authenticator(void* ctx, const std::string& allowed_raw, std::string who)
      : allowed_(allowed_raw), who_(std::move(who)) {
    socket_ = zmq_socket(ctx, ZMQ_REP);
    SetInt(socket_, ZMQ_LINGER, 0, "linger");
    if (zmq_bind(socket_, "inproc://zeromq.zap.01") != 0) {
      zmq_close(socket_);
      throw Error(ZmqError(who_ + ": cannot start the CURVE authenticator"));
    }
    thread_ = std::thread([this] { Run(); });
  }
  ~Authenticator() {
    stop_ = true;
    thread_.join();
    zmq_close(socket_);
  }

 private:
  void Run() {
    while (!stop_) {
      zmq_pollitem_t item{socket_, 0, ZMQ_POLLIN, 0};
      if (zmq_poll(&item, 1, 100) <= 0) continue;
      std::vector<std::string> req;
      do {
        zmq_msg_t m;
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, socket_, 0) < 0) {
          zmq_msg_close(&m);
          break;
        }
        req.emplace_back(static_cast<const char*>(zmq_msg_data(&m)), zmq_msg_size(&m));
        zmq_msg_close(&m);
      } while (RcvMore(socket_));
      // ZAP request: version, request id, domain, address, identity, mechanism, credentials.
      bool ok = req.size() >= 7 && req[5] == "CURVE" && req[6] == allowed_;
      if (!ok) Refused(req);
      std::string reqid = req.size() > 1 ? req[1] : "";
      const std::string reply[] = {"1.0", reqid, ok ? "200" : "400", ok ? "OK" : "unknown client key", "", ""};
      for (int i = 0; i < 6; ++i) SendCopy(socket_, reply[i].data(), reply[i].size(), i < 5 ? ZMQ_SNDMORE : 0);
    }
  }

  // Logged (rate-limited) and counted with every other refusal, by the peer's address.
  void Refused(const std::vector<std::string>& req) {
    std::string key = "?";
    if (req.size() >= 7 && req[6].size() == 32) {
      char z85[41];
      zmq_z85_encode(z85, reinterpret_cast<const uint8_t*>(req[6].data()), 32);
      key = z85;
    }
    std::string from = req.size() > 3 && !req[3].empty() ? req[3] : "an unknown address";
    RefusalLog::Get().Record(
        who_, from, "refused CURVE client at " + from + ": public key " + key + " is not the job's client key");
  }

  void* socket_;
  std::string allowed_;
  std::string who_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

TransportContext::TransportContext(std::string who) : who_(std::move(who)), ctx_(zmq_ctx_new()) {
  if (!ctx_) throw Error(ZmqError("cannot create a ZeroMQ context"));
  KeepFreedFramesMapped();
}

TransportContext::~TransportContext() {
  auth_.reset();
  while (zmq_ctx_term(ctx_) != 0 && zmq_errno() == EINTR) {
  }
}

void TransportContext::Authenticate(const CurveKeys& keys) {
  CheckKeyPair(keys.client_public, keys.client_secret, "client", false);
  std::string raw(32, '\0');
  zmq_z85_decode(reinterpret_cast<uint8_t*>(&raw[0]), keys.client_public.c_str());
  if (auth_) {
    SHOAL_CHECK(raw == allowed_, who_ + ": one process cannot admit two different client keys");
    return;
  }
  auth_ = std::make_unique<Authenticator>(ctx_, raw, who_);
  allowed_ = raw;
}

Transport::Transport(TransportContext& ctx, Kind kind, const CurveKeys& keys)
    : ctx_(ctx), kind_(kind), keyed_(keys.enabled()) {
  if (keys.enabled()) {
    CheckKeyPair(keys.server_public, keys.server_secret, "server", kind == Kind::kServer);
    CheckKeyPair(keys.client_public, keys.client_secret, "client", kind == Kind::kClient);
    if (kind == Kind::kServer) ctx.Authenticate(keys);
  }
  socket_ = zmq_socket(ctx.handle(), kind == Kind::kServer ? ZMQ_ROUTER : ZMQ_DEALER);
  if (!socket_) throw Error(ZmqError("cannot create a socket"));
  try {
    SetInt(socket_, ZMQ_LINGER, 0, "linger");
    // Kernel socket buffers stay at their (auto-tuned) defaults: fixed 4 MiB buffers
    // measured slower on loopback.
    if (kind == Kind::kClient) {
      // A client's own requests are never dropped or blocked; a server keeps ZeroMQ's
      // default high-water marks so one flooding peer meets TCP back-pressure instead of
      // growing the server's memory.
      SetInt(socket_, ZMQ_SNDHWM, 0, "sndhwm");
      SetInt(socket_, ZMQ_RCVHWM, 0, "rcvhwm");
    } else {
      SetMaxMessageBytes(kMaxFrameBytes);
      SetInt(socket_, ZMQ_ROUTER_HANDOVER, 1, "router_handover");
    }
    // A keyed client can be refused (a peer with another job's keys), and any client's
    // address may be some other service's (a web server): its monitor lets every "no
    // answer" error say so, through RefusalHint.
    // A keyed server's refused handshakes go to the refusal log (DrainEvents): its owner
    // must call DrainEvents regularly.
    if (keyed_ || kind == Kind::kClient) EnableMonitor();
    size_t fd_size = sizeof fd_;
    if (zmq_getsockopt(socket_, ZMQ_FD, &fd_, &fd_size) != 0) throw Error(ZmqError("socket option ZMQ_FD"));
    if (keys.enabled()) {
      if (kind == Kind::kServer) {
        SetInt(socket_, ZMQ_CURVE_SERVER, 1, "curve_server");
        SetStr(socket_, ZMQ_CURVE_SECRETKEY, keys.server_secret, "curve_secretkey");
        SetStr(socket_, ZMQ_ZAP_DOMAIN, "shoal", "zap_domain");
      } else {
        SetStr(socket_, ZMQ_CURVE_SERVERKEY, keys.server_public, "curve_serverkey");
        SetStr(socket_, ZMQ_CURVE_PUBLICKEY, keys.client_public, "curve_publickey");
        SetStr(socket_, ZMQ_CURVE_SECRETKEY, keys.client_secret, "curve_secretkey");
      }
    }
  } catch (...) {
    zmq_close(socket_);
    throw;
  }
}

Transport::~Transport() {
  zmqi::StopMonitor(socket_, &monitor_);
  zmq_close(socket_);
}

void Transport::SetMaxMessageBytes(int64_t bytes) { zmqi::SetMaxFrameBytes(socket_, bytes, keyed_); }

void Transport::SetSendQueue(int messages) { SetInt(socket_, ZMQ_SNDHWM, messages, "sndhwm"); }

std::string Transport::Bind(const std::string& endpoint) {
  drained_ = false;
  return zmqi::Bind(socket_, endpoint);
}

void Transport::Connect(const std::string& endpoint) {
  drained_ = false;
  if (zmq_connect(socket_, endpoint.c_str()) != 0) throw Error(ZmqError("cannot connect to " + endpoint));
}

void Transport::Send(OutMessage& m, const PeerId* to) {
  drained_ = false;
  if (to) SendCopy(socket_, to->data(), to->size(), ZMQ_SNDMORE);
  {
    zmq_msg_t header;
    size_t n = InitHeaderFrame(&header, m.builder);
    try {
      SendFrame(socket_, &header, m.payloads.empty() ? 0 : ZMQ_SNDMORE);
    } catch (...) {
      zmq_msg_close(&header);
      throw;
    }
    bytes_sent_ += n;
  }
  for (size_t i = 0; i < m.payloads.size(); ++i) {
    Payload& p = m.payloads[i];
    int flags = i + 1 < m.payloads.size() ? ZMQ_SNDMORE : 0;
    bytes_sent_ += p.size;
    if (p.size == 0) {
      SendCopy(socket_, nullptr, 0, flags);
      if (p.on_release) p.on_release();
      if (p.unreleased) --*p.unreleased;
      continue;
    }
    auto* hint = new Payload(std::move(p));
    zmq_msg_t frame;
    zmq_msg_init_data(&frame, const_cast<void*>(hint->data), hint->size, &ReleasePayload, hint);
    try {
      SendFrame(socket_, &frame, flags);
    } catch (...) {
      zmq_msg_close(&frame);  // runs ReleasePayload
      throw;
    }
  }
  m.payloads.clear();
}

bool Transport::TrySend(OutMessage& m) {
  SHOAL_CHECK(m.payloads.empty(), "TrySend: only payload-free messages");
  drained_ = false;
  zmq_msg_t header;
  size_t n = InitHeaderFrame(&header, m.builder);
  bool sent = false;
  try {
    sent = SendFrame(socket_, &header, ZMQ_DONTWAIT);
  } catch (...) {
    zmq_msg_close(&header);
    throw;
  }
  if (!sent) zmq_msg_close(&header);
  if (sent) bytes_sent_ += n;
  return sent;
}

bool Transport::Recv(InMessage* m, int timeout_ms) {
  const bool server = kind_ == Kind::kServer;
  // The first frame is the sender on a server socket, else the header.
  Frame& first = server ? identity_ : header_;
  // Try first without waiting: when messages are queued this saves a poll per message, and
  // when none is, the wait that follows needs no check of its own (drained_).
  if (zmq_msg_recv(FrameAccess::Msg(first), socket_, ZMQ_DONTWAIT) < 0) {
    drained_ = zmq_errno() == EAGAIN;
    if (timeout_ms == 0 || !Wait(timeout_ms)) return false;
    if (zmq_msg_recv(FrameAccess::Msg(first), socket_, ZMQ_DONTWAIT) < 0) return false;
  }
  drained_ = false;
  // A multipart message arrives whole or not at all, so these reads never block. Each frame
  // says whether another follows (cheaper than asking the socket, ZMQ_RCVMORE). Payloads are
  // received where they stay, in m->payloads.
  auto next = [this](Frame& f) {
    while (zmq_msg_recv(FrameAccess::Msg(f), socket_, 0) < 0)
      if (zmq_errno() != EINTR) return false;
    return true;
  };
  m->payloads.clear();
  bool more = zmq_msg_more(FrameAccess::Msg(first));
  const bool has_header = !server || more;
  if (server && more) {
    if (!next(header_)) return false;
    more = zmq_msg_more(FrameAccess::Msg(header_));
  }
  while (more) {
    m->payloads.emplace_back();
    if (!next(m->payloads.back())) {
      m->payloads.clear();
      return false;
    }
    more = zmq_msg_more(FrameAccess::Msg(m->payloads.back()));
  }
  // The first frames are let go once read, as ZeroMQ's receive buffer they point into
  // cannot be reused while any frame holds it.
  struct Release {
    Transport* t;
    ~Release() { t->identity_ = Frame(), t->header_ = Frame(); }
  } release{this};
  m->Accept(server ? &identity_ : nullptr, has_header ? &header_ : nullptr);
  return true;
}

void InMessage::Decode(std::vector<Frame>&& frames, bool with_identity) {
  size_t first = 0;
  const Frame* from = with_identity && !frames.empty() ? &frames[first++] : nullptr;
  const Frame* header = first < frames.size() ? &frames[first] : nullptr;
  payloads.clear();
  for (size_t i = first + 1; i < frames.size(); ++i) payloads.push_back(std::move(frames[i]));
  Accept(from, header);
}

void InMessage::Accept(const Frame* from, const Frame* header) {
  ResetHeader();
  if (from)
    identity.assign(static_cast<const char*>(from->data()), from->size());
  else
    identity.clear();
  try {
    SHOAL_CHECK(header, "message has no header frame");
    ParseHeader(*header);
  } catch (const Error& e) {
    payloads.clear();  // a refused message's frames are not kept until the next one
    throw BadMessage(e.what(), identity);
  }
  // ZeroMQ hands small frames over at any byte offset inside its receive buffer, and
  // tensors are read as floats: a misaligned frame is copied (large frames get their own,
  // aligned allocation, so the zero-copy path stays the common one).
  if (align_payloads)
    for (Frame& p : payloads)
      if (!p.aligned()) p = Aligned(std::move(p));
}

bool Transport::Readable() {
  int events = 0;
  size_t size = sizeof events;
  while (zmq_getsockopt(socket_, ZMQ_EVENTS, &events, &size) != 0)
    if (zmq_errno() != EINTR) throw Error(ZmqError("socket option ZMQ_EVENTS"));
  drained_ = !(events & ZMQ_POLLIN);
  return !drained_;
}

bool Transport::Wait(int timeout_ms) {
  Transport* self = this;
  char ready = 0;
  return WaitSockets(&self, 1, timeout_ms, &ready);
}

bool WaitAny(const std::vector<Transport*>& ts, int timeout_ms, std::vector<char>* ready) {
  ready->assign(ts.size(), 0);
  return Transport::WaitSockets(ts.data(), ts.size(), timeout_ms, ready->data());
}

// What zmq_poll does, less its first pass (a poll(2) of every ZMQ_FD with no timeout, then
// ZMQ_EVENTS of every socket) for sockets that a failed receive has just drained: on a
// server and a PS client, whose every wait follows one, three system calls of the dozen a
// message costs.
bool Transport::WaitSockets(Transport* const* ts, size_t n, int timeout_ms, char* ready) {
  // A client waits here once per answer: the usual few sockets are polled from the stack.
  pollfd few[8];
  std::vector<pollfd> many;
  pollfd* fds = few;
  if (n > 8) {
    many.resize(n);
    fds = many.data();
  }
  const auto deadline = Clock::now() + std::chrono::milliseconds(std::max(timeout_ms, 0));
  bool last = false;  // the poll with no time left has been made
  while (true) {
    bool any = false;
    for (size_t i = 0; i < n; ++i) {
      ready[i] = !ts[i]->drained_ && ts[i]->Readable();
      any = any || ready[i];
    }
    if (any || last) return any;
    int left = -1;  // forever
    if (timeout_ms >= 0) {
      left = std::max(0, int(std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count()));
      last = left == 0;
    }
    for (size_t i = 0; i < n; ++i) fds[i] = {ts[i]->fd_, POLLIN, 0};
    if (poll(fds, nfds_t(n), left) < 0 && errno != EINTR) throw Error(std::string("poll: ") + strerror(errno));
    // A readable ZMQ_FD means commands for that socket, not always a message: Readable()
    // handles them and says.
    for (size_t i = 0; i < n; ++i)
      if (fds[i].revents) ts[i]->drained_ = false;
  }
}

void Transport::EnableMonitor() {
  if (monitor_) return;
  drained_ = false;
  // Clients also hear of successful handshakes: a refusal followed by a success is over.
  monitor_ = zmqi::StartMonitor(
      ctx_.handle(), socket_,
      kind_ == Kind::kClient ? zmqi::kClientEvents : zmqi::kHandshakeFailedEvents | ZMQ_EVENT_DISCONNECTED);
}

std::vector<SocketEvent> Transport::DrainEvents() {
  std::vector<SocketEvent> events = zmqi::DrainMonitor(monitor_);
  if (kind_ == Kind::kServer) zmqi::NoteRefusals(ctx_.who(), &events, &refused_unclosed_);
  return events;
}

std::string Transport::RefusalHint() { return zmqi::RefusalHint(DrainEvents(), keyed_); }

namespace zmqi {

void* StartMonitor(void* ctx, void* s, int events) {
  // A fresh name each time: a closed monitor's name may stay taken until ZeroMQ reaps it,
  // so an owner's address (reused by the next allocation) would not do.
  static std::atomic<uint64_t> next{0};
  char addr[64];
  snprintf(addr, sizeof addr, "inproc://shoal-monitor-%llu", (unsigned long long)next.fetch_add(1));
  if (zmq_socket_monitor(s, addr, events) != 0) throw shoal::Error(Error("cannot monitor socket"));
  void* monitor = zmq_socket(ctx, ZMQ_PAIR);
  if (!monitor) throw shoal::Error(Error("cannot create the socket monitor"));
  SetInt(monitor, ZMQ_LINGER, 0, "linger");
  SetInt(monitor, ZMQ_RCVHWM, 0, "rcvhwm");
  if (zmq_connect(monitor, addr) != 0) {
    zmq_close(monitor);
    throw shoal::Error(Error("cannot connect the socket monitor"));
  }
  return monitor;
}

void StopMonitor(void* s, void** monitor) {
  if (!*monitor) return;
  zmq_socket_monitor(s, nullptr, 0);
  zmq_close(*monitor);
  *monitor = nullptr;
}

std::vector<SocketEvent> DrainMonitor(void* monitor) {
  std::vector<SocketEvent> out;
  if (!monitor) return out;
  while (true) {
    Frame head, where;
    if (zmq_msg_recv(FrameAccess::Msg(head), monitor, ZMQ_DONTWAIT) < 0) break;
    if (!RcvMore(monitor) || zmq_msg_recv(FrameAccess::Msg(where), monitor, ZMQ_DONTWAIT) < 0 || head.size() < 6)
      continue;
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

void NoteRefusals(const std::string& who, std::vector<SocketEvent>* events, int64_t* unclosed) {
  std::vector<SocketEvent> rest;
  for (SocketEvent& e : *events) {
    if (!(e.event & kHandshakeFailedEvents)) {
      // ZeroMQ closes every refused connection, reporting the disconnect after the failure:
      // that one is part of the refusal, not news for the owner's log.
      if (unclosed && e.is_disconnect() && *unclosed > 0) {
        --*unclosed;
        continue;
      }
      rest.push_back(std::move(e));
      continue;
    }
    if (unclosed) ++*unclosed;
    // The ZAP handler already logged and counted an authentication refusal, by the peer's
    // address; for the others ZeroMQ's monitor names only our own endpoint.
    if (e.event != ZMQ_EVENT_HANDSHAKE_FAILED_AUTH)
      RefusalLog::Get().Record(who, "a peer of " + e.endpoint, e.Describe());
  }
  events->swap(rest);
}

std::string RefusalHint(const std::vector<SocketEvent>& events, bool keyed) {
  // A peer holding another job's keys cannot finish the CURVE handshake: it drops the
  // connection (the client sees a handshake failure, or only the disconnect, again on every
  // reconnect) and the request waits out its deadline. Say so, and with whom, rather than
  // "not running". Only what happened since the last successful handshake counts: an
  // earlier refusal, or a peer that restarted, explains nothing about a link that works.
  int refused = 0, cut = 0;
  bool up = false;  // the last event was a successful handshake: a disconnect now ends a working link
  std::string detail, peer;
  for (const SocketEvent& e : events) {
    if (e.event == ZMQ_EVENT_HANDSHAKE_SUCCEEDED) {
      refused = cut = 0;
      up = true;
      continue;
    }
    if (e.is_disconnect()) {
      if (!up && ++cut == 1 && !refused) peer = e.endpoint;
      up = false;
      continue;
    }
    up = false;
    if (refused++) continue;
    peer = e.endpoint;
    if (e.event == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL)
      detail = ProtocolError(e.value);
    else if (e.event == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH)
      detail = "authentication refused (status " + std::to_string(e.value) + ")";
    else
      detail = std::string("the peer closed it: ") + zmq_strerror(e.value);
  }
  if (!keyed && refused)
    return " (the peer at " + peer + " is not a Shoal/ZeroMQ service (handshake failed " + std::to_string(refused) +
           " time(s), first: " + detail + "))";
  // One cut can be a Shoal process dying mid-handshake; a service that drops every
  // reconnect is not one.
  if (!keyed && cut > 1)
    return " (the peer at " + peer + " is not a Shoal/ZeroMQ service (handshake failed: it dropped the connection " +
           std::to_string(cut) + " time(s) before any handshake completed))";
  if (refused)
    return " (the CURVE handshake with " + peer + " failed " + std::to_string(refused) + " time(s), first: " + detail +
           "; do this job's [security] keys match that peer's?)";
  if (cut > 0)
    return " (" + peer + " dropped the connection " + std::to_string(cut) +
           " time(s) before any handshake completed: does it hold this job's [security] keys?)";
  return "";
}

}  // namespace zmqi

std::string ListenEndpoint(const std::string& host_port) {
  auto colon = host_port.rfind(':');
  SHOAL_CHECK(colon != std::string::npos, "address '" + host_port + "' is not host:port");
  std::string host = host_port.substr(0, colon);
  bool loopback = host == "localhost" || host.rfind("127.", 0) == 0;
  return "tcp://" + std::string(loopback ? (host == "localhost" ? "127.0.0.1" : host) : "*") + host_port.substr(colon);
}

std::string ReachableEndpoint(const std::string& host, const std::string& bound) {
  auto colon = bound.rfind(':');
  SHOAL_CHECK(colon != std::string::npos, "bound endpoint '" + bound + "' has no port");
  return "tcp://" + host + bound.substr(colon);
}

std::pair<std::string, std::string> CurveKeyPair() {
  char pub[41], sec[41];
  if (zmq_curve_keypair(pub, sec) != 0) throw Error("zmq_curve_keypair failed: this libzmq lacks CURVE support");
  return {pub, sec};
}

namespace {
std::string KindName(msg::Kind k) {
  for (auto e : capnp::Schema::from<msg::Kind>().getEnumerants())
    if (e.getOrdinal() == uint16_t(k)) return e.getProto().getName();
  return "unknown";
}
}  // namespace

std::string UnexpectedAnswer(const std::string& who, const std::string& address, msg::Kind asked, msg::Kind got) {
  std::string s = who + " at " + address + " answered " + KindName(asked) + " with message kind " +
                  std::to_string(int(got)) + " (" + KindName(got) + ")";
  if (got == asked)
    return s + ": that is the request itself coming back, so " + address +
           " is not a Shoal process but some other service (an echo?); check the job's addresses";
  return s + ": is " + address + " the right address for it?";
}

std::string PeerName(const PeerId& identity) {
  static const char* hex = "0123456789abcdef";
  std::string s = "peer 0x";
  for (size_t i = 0; i < identity.size() && i < 16; ++i) {
    auto c = static_cast<uint8_t>(identity[i]);
    s += hex[c >> 4];
    s += hex[c & 15];
  }
  return s;
}

}  // namespace shoal
