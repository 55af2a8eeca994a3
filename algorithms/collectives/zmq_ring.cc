#include "algorithms/collectives/zmq_ring.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>
#include <thread>
#include <unistd.h>

#include "common/error.h"
#include "common/transport/transport.h"

namespace shoal {
namespace {

constexpr uint32_t kMagic = 0x53484c52;  // "SHLR"

// Chunk c of n elements split N ways: [begin, end).
int64_t ChunkBegin(int64_t n, int N, int c) { return n * c / N; }

int Mod(int a, int n) { return ((a % n) + n) % n; }

}  // namespace

ZmqRing::Header ZmqRing::HeaderOf(const PipeMessage& m) {
  Header h;
  memcpy(&h, m.head.data(), sizeof h);  // frames promise no alignment
  return h;
}

namespace {
// Who can reach our abstract Unix socket: same host AND same network namespace (abstract
// sockets live in the namespace, so network-namespace test hosts must use TCP).
std::string HostName() {
  char h[256] = {0};
  gethostname(h, sizeof h - 1);
  char ns[128] = {0};
  ssize_t n = readlink("/proc/self/ns/net", ns, sizeof ns - 1);
  return std::string(h) + "/" + (n > 0 ? std::string(ns, size_t(n)) : std::string("?"));
}
}  // namespace

ZmqRing::ZmqRing(int rank, int size, Store& store, const RingOptions& opts)
    : rank_(rank), size_(size), opts_(opts), limiter_(opts.bandwidth_bytes_per_s) {
  if (size < 1 || rank < 0 || rank >= size)
    throw Error("ring: rank " + std::to_string(rank) + " outside size " + std::to_string(size));
  if (size == 1) return;
  try {
    Wire(store);
  } catch (...) {
    Abort();  // no destructor runs for a half-built ring
    throw;
  }
}

void ZmqRing::Wire(Store& store) {
  const int rank = rank_, size = size_;
  ctx_ = std::make_unique<TransportContext>("ring rank " + std::to_string(rank));
  PipeOptions po;
  // CurveZMQ from the job's keys: links are encrypted, and the context's ZAP handler admits
  // only peers holding the job's client key.
  po.keys = CurveKeys{opts_.curve_server_public, opts_.curve_server_secret, opts_.curve_client_public,
                      opts_.curve_client_secret};
  // Every collective sends at most one segment per message, so anything larger is hostile:
  // refused at the socket before it is allocated.
  po.max_message_bytes = SegmentBytes() + int64_t(sizeof(Header));
  in_ = std::make_unique<PipeIn>(*ctx_, po);
  out_ = std::make_unique<PipeOut>(*ctx_, po);
  // The job names hosts (an address or a name, "localhost" too); a name cannot be bound, so
  // bind as the shards do and publish the name with the port the kernel picked.
  std::string ep = ReachableEndpoint(opts_.bind_host, in_->Bind(ListenEndpoint(opts_.bind_host + ":*")));
  std::string id = opts_.prefix + "-" + std::to_string(rank) + "-" + std::to_string(getpid()) + "-" +
                   std::to_string(reinterpret_cast<uintptr_t>(this));
  // Peers on this host connect over a Unix socket: faster than TCP loopback.
  // Linux's abstract socket namespace ("@"): nothing on disk, so a killed rank leaves no
  // file behind.
  std::string ipc = in_->Bind("ipc://@shoal-" + id);
  store.Set(opts_.prefix + "-" + std::to_string(rank), ep + " " + ipc + " " + HostName());
  int right = (rank + 1) % size;
  std::string published = store.Get(opts_.prefix + "-" + std::to_string(right), opts_.rendezvous_timeout_ms);
  std::string right_ep = published, right_ipc, right_host;
  {
    size_t a = published.find(' '), b = a == std::string::npos ? a : published.find(' ', a + 1);
    if (b != std::string::npos) {
      right_ep = published.substr(0, a);
      right_ipc = published.substr(a + 1, b - a - 1);
      right_host = published.substr(b + 1);
    }
    if (!right_ipc.empty() && right_host == HostName() && !opts_.tcp_only) right_ep = right_ipc;
  }
  try {
    out_->Connect(right_ep);
  } catch (const Error& e) {
    throw Error("ring rank " + Named(rank) + ": rank " + Named(right) + ": " + e.what());
  }
  Barrier();  // the ring is wired once a token has gone round
}

ZmqRing::~ZmqRing() {
  bool abort = std::uncaught_exceptions() > 0;
  if (ctx_ && !abort) {
    try {
      WaitSendsReleased();
    } catch (const std::exception&) {
      abort = true;
    }
  }
  Close(abort);
}

void ZmqRing::Abort() { Close(true); }

// Closes every socket (on abort with zero linger: what is queued for a dead ring is moot)
// and terminates the context. zmq_ctx_term returns only after the I/O thread has let go of
// every message, so no zero-copy send still reads a caller's buffer once this returns: a
// failed collective unwinds into its caller, which then frees that buffer.
void ZmqRing::Close(bool abort) {
  if (!ctx_) return;
  if (in_) in_->Close(abort);
  if (out_) out_->Close(abort);
  // The context before the pipes: until its termination returns, ZeroMQ's I/O thread may
  // still run a zero-copy release callback that counts down out_'s in-flight counter.
  ctx_.reset();
  in_.reset();
  out_.reset();
}

std::string ZmqRing::Named(int ring_rank) const {
  const bool listed = ring_rank >= 0 && size_t(ring_rank) < opts_.members.size();
  return std::to_string(listed ? opts_.members[size_t(ring_rank)] : ring_rank);
}

int64_t ZmqRing::SegmentBytes() const { return std::max<int64_t>(opts_.segment_bytes, 8); }

void ZmqRing::WaitSendsReleased() {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(opts_.timeout_ms);
  while (out_ && out_->in_flight() > 0) {
    if (std::chrono::steady_clock::now() > deadline)
      throw Error("ring rank " + Named(rank_) + ": rank " + Named(Mod(rank_ + 1, size_)) +
                  " (right neighbour) took nothing for " + std::to_string(opts_.timeout_ms) + " ms" + RightRefusal());
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

// A ring whose ranks hold different keys stalls with every handshake refused: a rank waits
// on its left neighbour while its own link to the right one never came up. Each rank says
// so of its right link (it cannot tell from the left one), which names the peer.
std::string ZmqRing::RightRefusal() {
  std::string hint = out_ ? out_->RefusalHint() : "";
  if (hint.empty()) return "";
  return "; this rank's link to rank " + Named(Mod(rank_ + 1, size_)) + " (right neighbour) never carried data" + hint;
}

// Connections to our PULL socket are counted, not trusted one by one: anyone may connect
// (a port scan, a stray peer), so only when every accepted connection has gone (the left
// neighbour's among them) is the neighbour declared gone. And only once the neighbour has
// been heard from: a stranger that connects and closes before the neighbour's connection
// is accepted is no neighbour's death. An intruder that stays connected, or a neighbour
// that dies before its first message, leaves detection to the timeout.
void ZmqRing::CheckMonitors(const char* what) {
  (void)what;
  in_->UpdateConnections();
  left_gone_ = left_heard_ && in_->open_connections() == 0;
}

void ZmqRing::Send(const Header& h, const void* payload, size_t bytes, bool zero_copy) {
  limiter_.Acquire(double(sizeof h + bytes));
  out_->Send(&h, sizeof h, payload, bytes, zero_copy);
  bytes_sent_ += int64_t(sizeof h + bytes);
}

bool ZmqRing::TryRecv(PipeMessage* msg, const char* what) {
  size_t first = 0;
  PipeIn::Got got = in_->TryRecv(sizeof(Header), msg, &first);
  if (got == PipeIn::Got::kNothing) return false;
  if (got == PipeIn::Got::kMessage && HeaderOf(*msg).magic != kMagic) {
    got = PipeIn::Got::kMalformed;
    first = sizeof(Header);
  }
  if (got == PipeIn::Got::kMalformed) {
    // Anyone can reach the port: junk is dropped (and said once in a while), never fatal,
    // so stray bytes cannot stop a job.
    if (dropped_++ < 3 || dropped_ % 1000 == 0)
      fprintf(stderr, "ring rank %d %s: dropped a malformed message (first frame %zu bytes; %lld dropped so far)\n",
              rank_, what, first, (long long)dropped_);
    return false;
  }
  uint32_t seq = HeaderOf(*msg).seq;
  if (seq != seq_)
    throw Error(std::string("ring ") + what + ": out-of-step message (collective " + std::to_string(seq) +
                ", expected " + std::to_string(seq_) + "): ranks called different collectives");
  left_heard_ = true;
  return true;
}
// Data queued before a disconnect is still delivered: the left neighbour counts as gone
// only when its socket closed AND nothing it sent is left to read. Its death then
// cascades round the ring, each rank failing on its own left neighbour.
void ZmqRing::Recv(PipeMessage* msg, const char* what) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(opts_.timeout_ms);
  while (true) {
    if (TryRecv(msg, what)) return;
    CheckMonitors(what);
    if (left_gone_) {
      if (TryRecv(msg, what)) return;
      throw Error(std::string("ring ") + what + ": rank " + Named(Mod(rank_ - 1, size_)) +
                  " (left neighbour) disconnected: it stopped or crashed");
    }
    in_->Wait(100);
    if (std::chrono::steady_clock::now() > deadline)
      throw Error(std::string("ring ") + what + ": no data from rank " + Named(Mod(rank_ - 1, size_)) + " for " +
                  std::to_string(opts_.timeout_ms) + " ms" + RightRefusal() + RefusedHandshakes());
  }
}

void ZmqRing::AllReduce(float* data, int64_t n, ReduceOp op, DType wire) {
  Pass(data, n, op, WireFormat{wire}, true, true);
}

void ZmqRing::AllReduceQuantized(float* data, int64_t n, ReduceOp op, BlockQuant q) {
  Pass(data, n, op, WireFormat{DType::kF32, true, q}, true, true);
}

std::pair<int64_t, int64_t> ZmqRing::OwnedChunk(int64_t n) const {
  int own = Mod(rank_ + 1, size_);
  return {ChunkBegin(n, size_, own), ChunkBegin(n, size_, own + 1)};
}

std::pair<int64_t, int64_t> ZmqRing::ReduceScatter(float* data, int64_t n, ReduceOp op, DType wire) {
  Pass(data, n, op, WireFormat{wire}, true, false);
  return OwnedChunk(n);
}

void ZmqRing::AllGatherChunks(float* data, int64_t n, DType wire) {
  Pass(data, n, ReduceOp::kSum, WireFormat{wire}, false, true);
}

int64_t ZmqRing::WireFormat::Bytes(int64_t count) const {
  return quantized ? QuantizedBytes(q, count) : count * int64_t(DTypeSize(dtype));
}

int64_t ZmqRing::WireFormat::SegmentElems(int64_t segment_bytes) const {
  if (!quantized) return std::max<int64_t>(1, segment_bytes / int64_t(DTypeSize(dtype)));
  // Whole blocks, so a segment's blocks are the same elements at every hop; under one
  // block's bytes, one partial block.
  const int64_t block_bytes = QuantizedBytes(q, kQuantBlock);
  if (segment_bytes >= block_bytes) return segment_bytes / block_bytes * kQuantBlock;
  return std::max<int64_t>(1, (segment_bytes - 4) * (q == BlockQuant::kInt8 ? 1 : 2));
}

void ZmqRing::Pass(float* data, int64_t n, ReduceOp op, const WireFormat& wire, bool reduce_scatter, bool all_gather) {
  if (size_ == 1) {
    return;
  }
  CheckUsable();
  try {
    ++seq_;
    const int N = size_;
    const bool raw = !wire.quantized && wire.dtype == DType::kF32;
    const int64_t seg_elems = wire.SegmentElems(SegmentBytes());
    auto encode = [&](const float* src, int64_t cnt, uint8_t* out) {
      if (wire.quantized)
        QuantizeBlocks(wire.q, src, cnt, out);
      else
        EncodeFloats(src, size_t(cnt), wire.dtype, out);
    };
    // Quantized: each reduced chunk's encoding, segment by segment, as its owner made it. The
    // all-gather passes these bytes on unchanged (encoding decoded values again may not give
    // the same bytes), so every rank decodes what the owner decoded.
    std::vector<std::vector<std::vector<uint8_t>>> kept(wire.quantized ? size_t(N) : 0);
    auto send_chunk = [&](int c, uint32_t step, bool from_kept) {
      int64_t b = ChunkBegin(n, N, c), e = ChunkBegin(n, N, c + 1);
      uint32_t s = 0;
      do {
        int64_t sb = b + int64_t(s) * seg_elems, se = std::min(e, sb + seg_elems);
        Header h{kMagic, seq_, step, s};
        int64_t cnt = std::max<int64_t>(0, se - sb);
        if (from_kept) {
          const std::vector<uint8_t>& k = kept[size_t(c)][s];
          Send(h, k.data(), k.size(), false);
        } else if (raw) {
          Send(h, data + sb, size_t(cnt) * 4, /*zero_copy=*/true);
        } else {
          scratch_.resize(size_t(wire.Bytes(cnt)));
          encode(data + sb, cnt, scratch_.data());
          Send(h, scratch_.data(), scratch_.size(), false);
        }
        ++s;
      } while (b + int64_t(s) * seg_elems < e);
    };
    // Receives chunk c segment by segment; reduce = add into data, else overwrite (and, when
    // quantized, keep the bytes to pass on).
    std::vector<float> tmp;
    auto recv_chunk = [&](int c, uint32_t step, bool reduce, const char* what) {
      int64_t b = ChunkBegin(n, N, c), e = ChunkBegin(n, N, c + 1);
      uint32_t s = 0;
      do {
        int64_t sb = b + int64_t(s) * seg_elems, se = std::min(e, sb + seg_elems);
        int64_t cnt = std::max<int64_t>(0, se - sb);
        PipeMessage m;
        Recv(&m, what);
        if (HeaderOf(m).step != step || HeaderOf(m).segment != s || m.body.size() != size_t(wire.Bytes(cnt)))
          throw Error(std::string("ring ") + what + ": unexpected segment (step " + std::to_string(HeaderOf(m).step) +
                      " segment " + std::to_string(HeaderOf(m).segment) + ", " + std::to_string(m.body.size()) +
                      " bytes)");
        const uint8_t* in = static_cast<const uint8_t*>(m.body.data());
        if (wire.quantized) {
          tmp.assign(size_t(cnt), 0.f);
          AddDequantized(wire.q, in, int64_t(m.body.size()), cnt, tmp.data(),
                         std::string("ring ") + what + ": rank " + Named(Mod(rank_ - 1, N)) + "'s segment");
          if (!reduce) kept[size_t(c)].emplace_back(in, in + m.body.size());
          in = reinterpret_cast<const uint8_t*>(tmp.data());
        } else if (!raw) {
          tmp.resize(size_t(cnt));
          DecodeFloats(in, size_t(cnt), wire.dtype, tmp.data());
          in = reinterpret_cast<const uint8_t*>(tmp.data());
        }
        float* out = data + sb;
        if (reduce) {
          AddFloats(out, in, size_t(cnt));  // ZeroMQ may deliver the body at any byte offset
        } else if (cnt > 0) {               // an empty chunk's pointers may be null
          memcpy(out, in, size_t(cnt) * 4);
        }
        ++s;
      } while (b + int64_t(s) * seg_elems < e);
    };
    // Reduce-scatter: after N-1 steps rank r holds the full sum of chunk (r+1) mod N.
    for (int step = 0; reduce_scatter && step < N - 1; ++step) {
      send_chunk(Mod(rank_ - step, N), uint32_t(step), false);
      recv_chunk(Mod(rank_ - step - 1, N), uint32_t(step), true, "all-reduce");
    }
    // The owner rounds its chunk the way the wire will, so every rank ends identical.
    int own = Mod(rank_ + 1, N);
    int64_t ob = ChunkBegin(n, N, own), oe = ChunkBegin(n, N, own + 1);
    if (reduce_scatter && op == ReduceOp::kMean)
      for (int64_t i = ob; i < oe; ++i) data[i] /= float(N);
    if (wire.quantized) {
      int64_t sb = ob;
      do {
        const int64_t cnt = std::max<int64_t>(0, std::min(oe, sb + seg_elems) - sb);
        std::vector<uint8_t> enc(static_cast<size_t>(wire.Bytes(cnt)));
        encode(data + sb, cnt, enc.data());
        std::fill(data + sb, data + sb + cnt, 0.f);
        AddDequantized(wire.q, enc.data(), int64_t(enc.size()), cnt, data + sb, "ring: this rank's own chunk");
        kept[size_t(own)].push_back(std::move(enc));
        sb += seg_elems;
      } while (sb < oe);
    } else if (!raw) {
      scratch_.resize(size_t(wire.Bytes(oe - ob)));
      encode(data + ob, oe - ob, scratch_.data());
      DecodeFloats(scratch_.data(), size_t(oe - ob), wire.dtype, data + ob);
    }
    // All-gather the reduced chunks.
    for (int step = 0; all_gather && step < N - 1; ++step) {
      send_chunk(Mod(rank_ + 1 - step, N), uint32_t(N + step), wire.quantized);
      recv_chunk(Mod(rank_ - step, N), uint32_t(N + step), false, "all-reduce");
    }
    WaitSendsReleased();  // the caller may overwrite `data` once we return
  } catch (...) {
    Abort();  // ZeroMQ may still hold `data` in a zero-copy send: let go before unwinding
    throw;
  }
}

void ZmqRing::CheckUsable() const {
  if (!ctx_) throw Error("ring rank " + Named(rank_) + ": the ring was torn down by an earlier failed collective");
}

// Sends `bytes` from `data` as segments of at most SegmentBytes(), numbered from 0.
void ZmqRing::SendSegments(uint32_t step, const uint8_t* data, int64_t bytes) {
  const int64_t seg = SegmentBytes();
  uint32_t s = 0;
  int64_t off = 0;
  do {
    int64_t cnt = std::min(seg, bytes - off);
    Send(Header{kMagic, seq_, step, s}, data + off, size_t(cnt), false);
    off += cnt;
    ++s;
  } while (off < bytes);
}

// Receives what SendSegments sent into `data`; `forward`: passes each segment on to the right
// as it arrives (broadcast), so large buffers stream through the ring.
void ZmqRing::RecvSegments(uint32_t step, uint8_t* data, int64_t bytes, bool forward, const char* what) {
  const int64_t seg = SegmentBytes();
  uint32_t s = 0;
  int64_t off = 0;
  do {
    int64_t cnt = std::min(seg, bytes - off);
    PipeMessage m;
    Recv(&m, what);
    if (HeaderOf(m).step != step || HeaderOf(m).segment != s || m.body.size() != size_t(cnt))
      throw Error(std::string("ring ") + what + ": unexpected message (step " + std::to_string(HeaderOf(m).step) +
                  " segment " + std::to_string(HeaderOf(m).segment) + ", " + std::to_string(m.body.size()) +
                  " bytes; expected step " + std::to_string(step) + " segment " + std::to_string(s) + ", " +
                  std::to_string(cnt) + " bytes)");
    if (cnt > 0) memcpy(data + off, m.body.data(), size_t(cnt));
    if (forward) Send(Header{kMagic, seq_, step, s}, data + off, size_t(cnt), false);
    off += cnt;
    ++s;
  } while (off < bytes);
}

void ZmqRing::AllGather(const void* in, int64_t bytes, void* out) {
  if (bytes <= 0) return;  // every rank passes the same size: all skip alike
  auto* o = static_cast<uint8_t*>(out);
  memcpy(o + bytes * rank_, in, size_t(bytes));
  if (size_ == 1) return;
  CheckUsable();
  ++seq_;
  try {
    for (int step = 0; step < size_ - 1; ++step) {
      int send_c = Mod(rank_ - step, size_), recv_c = Mod(rank_ - step - 1, size_);
      SendSegments(uint32_t(step), o + bytes * send_c, bytes);
      RecvSegments(uint32_t(step), o + bytes * recv_c, bytes, false, "all-gather");
    }
  } catch (...) {
    Abort();  // as a failed all-reduce: the neighbours see this rank go and fail at once too
    throw;
  }
}

void ZmqRing::Broadcast(void* data, int64_t bytes, int root) {
  if (size_ == 1) return;
  if (root < 0 || root >= size_)
    throw Error("ring broadcast: root " + std::to_string(root) + " outside size " + std::to_string(size_));
  CheckUsable();
  ++seq_;
  // Passed along the ring from the root; the rank before the root does not forward.
  int dist = Mod(rank_ - root, size_);
  auto* d = static_cast<uint8_t*>(data);
  try {
    if (dist == 0)
      SendSegments(0, d, bytes);
    else
      RecvSegments(0, d, bytes, dist != size_ - 1, "broadcast");
  } catch (...) {
    Abort();
    throw;
  }
}

void ZmqRing::Barrier() {
  float x = 0;
  AllReduce(&x, 1, ReduceOp::kSum);
}

}  // namespace shoal
