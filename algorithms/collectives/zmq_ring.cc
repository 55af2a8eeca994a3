#include "algorithms/collectives/zmq_ring.h"

#include <zmq.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <exception>

#include "common/error.h"

namespace shoal {
namespace {

// Every ring message starts with this header; the payload follows in the same frame.
struct Header {
  uint32_t magic;  // kMagic: rejects stray bytes from anything that is not our left neighbour
  uint32_t seq;    // collective sequence number: both sides must be in the same collective
  uint32_t step;   // ring step within the collective
  uint32_t segment;
};
constexpr uint32_t kMagic = 0x53484c52;  // "SHLR"

void ZmqCheck(int rc, const std::string& what) {
  if (rc != 0) throw Error(what + ": " + zmq_strerror(zmq_errno()));
}

void* MonitorSocket(void* ctx, void* sock, const std::string& name) {
  ZmqCheck(zmq_socket_monitor(sock, ("inproc://" + name).c_str(), ZMQ_EVENT_DISCONNECTED | ZMQ_EVENT_HANDSHAKE_SUCCEEDED | ZMQ_EVENT_ACCEPTED | ZMQ_EVENT_CONNECTED), "zmq_socket_monitor");
  void* m = zmq_socket(ctx, ZMQ_PAIR);
  ZmqCheck(zmq_connect(m, ("inproc://" + name).c_str()), "monitor connect");
  return m;
}

// Reads one monitor event if any; returns the event id or 0.
int PollMonitor(void* mon) {
  zmq_msg_t ev;
  zmq_msg_init(&ev);
  if (zmq_msg_recv(&ev, mon, ZMQ_DONTWAIT) < 0) {
    zmq_msg_close(&ev);
    return 0;
  }
  uint16_t id = 0;
  if (zmq_msg_size(&ev) >= 2) memcpy(&id, zmq_msg_data(&ev), 2);
  zmq_msg_close(&ev);
  // The second frame holds the endpoint.
  zmq_msg_t addr;
  zmq_msg_init(&addr);
  zmq_msg_recv(&addr, mon, 0);
  zmq_msg_close(&addr);
  return id;
}

// Chunk c of n elements split N ways: [begin, end).
int64_t ChunkBegin(int64_t n, int N, int c) { return n * c / N; }

int Mod(int a, int n) { return ((a % n) + n) % n; }

}  // namespace

struct ZmqRing::Msg {
  zmq_msg_t m;
  Msg() { zmq_msg_init(&m); }
  ~Msg() { zmq_msg_close(&m); }
  const Header& header() const { return *static_cast<const Header*>(zmq_msg_data(const_cast<zmq_msg_t*>(&m))); }
  const uint8_t* payload() const { return static_cast<const uint8_t*>(zmq_msg_data(const_cast<zmq_msg_t*>(&m))) + sizeof(Header); }
  size_t payload_size() const { return zmq_msg_size(const_cast<zmq_msg_t*>(&m)) - sizeof(Header); }
};

ZmqRing::ZmqRing(int rank, int size, Store& store, const RingOptions& opts) : rank_(rank), size_(size), opts_(opts) {
  if (size < 1 || rank < 0 || rank >= size) throw Error("ring: rank " + std::to_string(rank) + " outside size " + std::to_string(size));
  if (size == 1) return;
  ctx_ = zmq_ctx_new();
  pull_ = zmq_socket(ctx_, ZMQ_PULL);
  push_ = zmq_socket(ctx_, ZMQ_PUSH);
  // Linger: what we sent must still reach the neighbour after we close.
  int zero = 0, big = 4 << 20, linger = 10000;
  for (void* s : {pull_, push_}) {
    zmq_setsockopt(s, ZMQ_SNDHWM, &zero, sizeof zero);
    zmq_setsockopt(s, ZMQ_RCVHWM, &zero, sizeof zero);
    zmq_setsockopt(s, ZMQ_SNDBUF, &big, sizeof big);
    zmq_setsockopt(s, ZMQ_RCVBUF, &big, sizeof big);
    zmq_setsockopt(s, ZMQ_LINGER, &linger, sizeof linger);
  }
  // A message larger than any collective could send is hostile: refuse it at the socket.
  int64_t maxmsg = int64_t(1) << 34;
  zmq_setsockopt(pull_, ZMQ_MAXMSGSIZE, &maxmsg, sizeof maxmsg);
  std::string bind = "tcp://" + opts_.bind_host + ":*";
  ZmqCheck(zmq_bind(pull_, bind.c_str()), "ring rank " + std::to_string(rank) + ": bind " + bind);
  char ep[256];
  size_t len = sizeof ep;
  ZmqCheck(zmq_getsockopt(pull_, ZMQ_LAST_ENDPOINT, ep, &len), "ZMQ_LAST_ENDPOINT");
  std::string id = opts_.prefix + "-" + std::to_string(rank) + "-" + std::to_string(reinterpret_cast<uintptr_t>(this));
  mon_pull_ = MonitorSocket(ctx_, pull_, id + "-pull");
  store.Set(opts_.prefix + "-" + std::to_string(rank), ep);
  int right = (rank + 1) % size;
  std::string right_ep = store.Get(opts_.prefix + "-" + std::to_string(right), opts_.rendezvous_timeout_ms);
  ZmqCheck(zmq_connect(push_, right_ep.c_str()), "ring rank " + std::to_string(rank) + ": connect to rank " + std::to_string(right) + " at " + right_ep);
  Barrier();  // the ring is wired once a token has gone round
}

ZmqRing::~ZmqRing() {
  // Unwinding from a failed collective: what is still queued for a dead ring is moot.
  if (std::uncaught_exceptions() > 0 && push_) {
    int linger = 0;
    zmq_setsockopt(push_, ZMQ_LINGER, &linger, sizeof linger);
  }
  for (void* s : {mon_pull_, pull_, push_})
    if (s) zmq_close(s);
  if (ctx_) zmq_ctx_term(ctx_);
}

void ZmqRing::CheckMonitors(const char* what) {
  (void)what;
  int ev;
  while ((ev = PollMonitor(mon_pull_)) != 0) {
    if (ev == ZMQ_EVENT_ACCEPTED || ev == ZMQ_EVENT_HANDSHAKE_SUCCEEDED) left_connected_ = true;
    if (ev == ZMQ_EVENT_DISCONNECTED && left_connected_) left_gone_ = true;
  }
}

void ZmqRing::Send(const void* header, size_t hbytes, const void* payload, size_t pbytes) {
  zmq_msg_t m;
  zmq_msg_init_size(&m, hbytes + pbytes);
  memcpy(zmq_msg_data(&m), header, hbytes);
  if (pbytes) memcpy(static_cast<uint8_t*>(zmq_msg_data(&m)) + hbytes, payload, pbytes);
  while (zmq_msg_send(&m, push_, 0) < 0) {
    if (zmq_errno() != EINTR) {
      zmq_msg_close(&m);
      throw Error(std::string("ring send: ") + zmq_strerror(zmq_errno()));
    }
  }
  bytes_sent_ += int64_t(hbytes + pbytes);
}

bool ZmqRing::TryRecv(Msg* msg, const char* what) {
  if (zmq_msg_recv(&msg->m, pull_, ZMQ_DONTWAIT) < 0) return false;
  if (zmq_msg_size(&msg->m) < sizeof(Header) || msg->header().magic != kMagic)
    throw Error(std::string("ring ") + what + ": malformed message from the left neighbour (" +
                std::to_string(zmq_msg_size(&msg->m)) + " bytes, bad header)");
  if (msg->header().seq != seq_)
    throw Error(std::string("ring ") + what + ": out-of-step message (collective " + std::to_string(msg->header().seq) +
                ", expected " + std::to_string(seq_) + "): ranks called different collectives");
  return true;
}

// Data queued before a disconnect is still delivered: the left neighbour counts as gone
// only when its socket closed AND nothing it sent is left to read. Its death then
// cascades round the ring, each rank failing on its own left neighbour.
void ZmqRing::Recv(Msg* msg, const char* what) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(opts_.timeout_ms);
  while (true) {
    if (TryRecv(msg, what)) return;
    CheckMonitors(what);
    if (left_gone_) {
      if (TryRecv(msg, what)) return;
      throw Error(std::string("ring ") + what + ": rank " + std::to_string(Mod(rank_ - 1, size_)) +
                  " (left neighbour) disconnected: it stopped or crashed");
    }
    zmq_pollitem_t items[] = {{pull_, 0, ZMQ_POLLIN, 0}, {mon_pull_, 0, ZMQ_POLLIN, 0}};
    int rc = zmq_poll(items, 2, 100);
    if (rc < 0 && zmq_errno() != EINTR) throw Error(std::string("ring poll: ") + zmq_strerror(zmq_errno()));
    if (std::chrono::steady_clock::now() > deadline)
      throw Error(std::string("ring ") + what + ": no data from rank " + std::to_string(Mod(rank_ - 1, size_)) + " for " +
                  std::to_string(opts_.timeout_ms) + " ms");
  }
}

void ZmqRing::AllReduce(float* data, int64_t n, ReduceOp op, DType wire) {
  if (size_ > 1) {
    ++seq_;
    const int N = size_;
    const size_t es = DTypeSize(wire);
    const int64_t seg_elems = std::max<int64_t>(1, opts_.segment_bytes / int64_t(es));
    auto send_chunk = [&](int c, uint32_t step) {
      int64_t b = ChunkBegin(n, N, c), e = ChunkBegin(n, N, c + 1);
      uint32_t s = 0;
      do {
        int64_t sb = b + int64_t(s) * seg_elems, se = std::min(e, sb + seg_elems);
        Header h{kMagic, seq_, step, s};
        int64_t cnt = std::max<int64_t>(0, se - sb);
        if (wire == DType::kF32) {
          Send(&h, sizeof h, data + sb, size_t(cnt) * 4);
        } else {
          scratch_.resize(size_t(cnt) * es);
          EncodeFloats(data + sb, size_t(cnt), wire, scratch_.data());
          Send(&h, sizeof h, scratch_.data(), scratch_.size());
        }
        ++s;
      } while (b + int64_t(s) * seg_elems < e);
    };
    // Receives chunk c segment by segment; reduce = add into data, else overwrite.
    std::vector<float> tmp;
    auto recv_chunk = [&](int c, uint32_t step, bool reduce, const char* what) {
      int64_t b = ChunkBegin(n, N, c), e = ChunkBegin(n, N, c + 1);
      uint32_t s = 0;
      do {
        int64_t sb = b + int64_t(s) * seg_elems, se = std::min(e, sb + seg_elems);
        int64_t cnt = std::max<int64_t>(0, se - sb);
        Msg m;
        Recv(&m, what);
        if (m.header().step != step || m.header().segment != s || m.payload_size() != size_t(cnt) * es)
          throw Error(std::string("ring ") + what + ": unexpected segment (step " + std::to_string(m.header().step) + " segment " +
                      std::to_string(m.header().segment) + ", " + std::to_string(m.payload_size()) + " bytes)");
        const float* in;
        if (wire == DType::kF32) {
          in = reinterpret_cast<const float*>(m.payload());
        } else {
          tmp.resize(size_t(cnt));
          DecodeFloats(m.payload(), size_t(cnt), wire, tmp.data());
          in = tmp.data();
        }
        float* out = data + sb;
        if (reduce) for (int64_t i = 0; i < cnt; ++i) out[i] += in[i];
        else memcpy(out, in, size_t(cnt) * 4);
        ++s;
      } while (b + int64_t(s) * seg_elems < e);
    };
    // Reduce-scatter: after N-1 steps rank r holds the full sum of chunk (r+1) mod N.
    for (int step = 0; step < N - 1; ++step) {
      send_chunk(Mod(rank_ - step, N), uint32_t(step));
      recv_chunk(Mod(rank_ - step - 1, N), uint32_t(step), true, "all-reduce");
    }
    // The owner rounds its chunk the way the wire will, so every rank ends identical.
    int own = Mod(rank_ + 1, N);
    int64_t ob = ChunkBegin(n, N, own), oe = ChunkBegin(n, N, own + 1);
    if (op == ReduceOp::kMean) for (int64_t i = ob; i < oe; ++i) data[i] /= float(N);
    if (wire != DType::kF32) {
      scratch_.resize(size_t(oe - ob) * es);
      EncodeFloats(data + ob, size_t(oe - ob), wire, scratch_.data());
      DecodeFloats(scratch_.data(), size_t(oe - ob), wire, data + ob);
    }
    // All-gather the reduced chunks.
    for (int step = 0; step < N - 1; ++step) {
      send_chunk(Mod(rank_ + 1 - step, N), uint32_t(N + step));
      recv_chunk(Mod(rank_ - step, N), uint32_t(N + step), false, "all-reduce");
    }
  }
}

void ZmqRing::AllGather(const void* in, int64_t bytes, void* out) {
  auto* o = static_cast<uint8_t*>(out);
  memcpy(o + bytes * rank_, in, size_t(bytes));
  if (size_ == 1) return;
  ++seq_;
  for (int step = 0; step < size_ - 1; ++step) {
    int send_c = Mod(rank_ - step, size_), recv_c = Mod(rank_ - step - 1, size_);
    Header h{kMagic, seq_, uint32_t(step), 0};
    Send(&h, sizeof h, o + bytes * send_c, size_t(bytes));
    Msg m;
    Recv(&m, "all-gather");
    if (m.header().step != uint32_t(step) || m.payload_size() != size_t(bytes))
      throw Error("ring all-gather: unexpected message (" + std::to_string(m.payload_size()) + " bytes, expected " + std::to_string(bytes) + ")");
    memcpy(o + bytes * recv_c, m.payload(), size_t(bytes));
  }
}

void ZmqRing::Broadcast(void* data, int64_t bytes, int root) {
  if (size_ == 1) return;
  if (root < 0 || root >= size_) throw Error("ring broadcast: root " + std::to_string(root) + " outside size " + std::to_string(size_));
  ++seq_;
  // Passed along the ring from the root; the rank before the root does not forward.
  int dist = Mod(rank_ - root, size_);
  Header h{kMagic, seq_, 0, 0};
  if (dist != 0) {
    Msg m;
    Recv(&m, "broadcast");
    if (m.payload_size() != size_t(bytes))
      throw Error("ring broadcast: " + std::to_string(m.payload_size()) + " bytes, expected " + std::to_string(bytes));
    memcpy(data, m.payload(), size_t(bytes));
  }
  if (dist != size_ - 1) Send(&h, sizeof h, data, size_t(bytes));
}

void ZmqRing::Barrier() {
  float x = 0;
  AllReduce(&x, 1, ReduceOp::kSum);
}

}  // namespace shoal
