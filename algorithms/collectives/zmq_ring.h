// Bandwidth-optimal ring all-reduce over ZeroMQ (reduce-scatter then all-gather, as in
// Baidu's ring and gloo's allreduce_ring): each rank sends 2(N-1)/N of the data whatever
// N is. Each rank binds one PULL socket (from its left neighbour) and connects one PUSH
// socket (to its right); segments are pipelined so adding one overlaps receiving the next.
// A neighbour that disconnects mid-collective, or silence past the timeout, is an error
// naming the rank, never a hang. A failed collective tears this rank's ring down (every
// later call throws), so its neighbours see it go and fail at once instead of waiting.
#pragma once
#include <memory>
#include <utility>
#include <string>
#include <vector>

#include "algorithms/collectives/communicator.h"
#include "common/rendezvous/store.h"
#include "common/rate_limiter.h"
#include "common/transport/pipe.h"

namespace shoal {

struct RingOptions {
  std::string bind_host = "127.0.0.1";
  int timeout_ms = 60000;           // no progress for this long = error
  int64_t segment_bytes = 1 << 20;  // pipelining unit, and the largest message a rank accepts
  std::string prefix = "ring";      // store key prefix (one ring per prefix)
  int rendezvous_timeout_ms = 60000;
  bool tcp_only = false;             // else same-host neighbours use a Unix socket
  double bandwidth_bytes_per_s = 0;  // > 0: token bucket on sends (simulated slow link)
  // CurveZMQ (Z85 keys from the job's [security]): when set, ring links are encrypted and
  // a peer must hold the job's keys to complete the handshake.
  std::string curve_server_public, curve_server_secret, curve_client_public, curve_client_secret;
  // The job rank of each ring rank, for messages (a ring among some workers); empty: the same.
  std::vector<int> members;
};

class ZmqRing : public Communicator {
 public:
  // Binds, publishes "<prefix>-<rank>" in the store, reads every peer's endpoint and
  // connects; returns once the ring is wired.
  ZmqRing(int rank, int size, Store& store, const RingOptions& opts = RingOptions());
  ~ZmqRing() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string Name() const override { return "zmq-ring"; }
  void AllReduce(float* data, int64_t n, ReduceOp op, DType wire = DType::kF32) override;
  // Reduce-scatter with each hop's partial sums block-quantized, then the owners' encodings
  // passed on unchanged in the all-gather: every rank decodes the very bytes the owner decoded.
  void AllReduceQuantized(float* data, int64_t n, ReduceOp op, BlockQuant q) override;
  void AllGather(const void* in, int64_t bytes, void* out) override;
  // The two halves of AllReduce, for composite collectives (2D torus, hierarchical):
  // ReduceScatter leaves this rank the reduced chunk it returns ([begin, end) of data);
  // AllGatherChunks then spreads every rank's chunk to all.
  std::pair<int64_t, int64_t> ReduceScatter(float* data, int64_t n, ReduceOp op, DType wire = DType::kF32);
  void AllGatherChunks(float* data, int64_t n, DType wire = DType::kF32);
  std::pair<int64_t, int64_t> OwnedChunk(int64_t n) const;
  void Broadcast(void* data, int64_t bytes, int root) override;
  void Barrier() override;
  int64_t bytes_sent() const override { return bytes_sent_; }

 private:
  // Every ring message: this header frame, then the payload frame.
  struct Header {
    uint32_t magic;  // rejects stray bytes from anything that is not our left neighbour
    uint32_t seq;    // collective sequence number: both sides must be in the same collective
    uint32_t step;   // ring step within the collective
    uint32_t segment;
  };
  // How a segment of floats travels: as fp32/fp16/bf16 values, or block-quantized.
  struct WireFormat {
    DType dtype = DType::kF32;
    bool quantized = false;
    BlockQuant q = BlockQuant::kInt8;
    int64_t Bytes(int64_t count) const;
    int64_t SegmentElems(int64_t segment_bytes) const;  // most values whose encoding fits
  };
  void Pass(float* data, int64_t n, ReduceOp op, const WireFormat& wire, bool reduce_scatter, bool all_gather);
  void Send(const Header& h, const void* payload, size_t bytes, bool zero_copy);
  void SendSegments(uint32_t step, const uint8_t* data, int64_t bytes);
  void RecvSegments(uint32_t step, uint8_t* data, int64_t bytes, bool forward, const char* what);
  // A ring rank as messages name it (its job rank, RingOptions::members).
  std::string Named(int ring_rank) const;
  // The largest payload of one message: what the receiving socket admits.
  int64_t SegmentBytes() const;
  void WaitSendsReleased();
  void Wire(Store& store);
  void Close(bool abort);
  void Abort();
  void CheckUsable() const;
  // Receives one message from the left neighbour into `msg` (bounded wait).
  void Recv(PipeMessage* msg, const char* what);
  bool TryRecv(PipeMessage* msg, const char* what);
  void CheckMonitors(const char* what);
  // For a timeout's error: " ...(why)" when the right neighbour refused our handshake, else "".
  std::string RightRefusal();
  static Header HeaderOf(const PipeMessage& m);

  int rank_, size_;
  RingOptions opts_;
  // The ring's own context: terminating it on a failure is what guarantees ZeroMQ let go of
  // every zero-copy send before the caller's buffer is freed.
  std::unique_ptr<TransportContext> ctx_;
  std::unique_ptr<PipeIn> in_;    // from the left neighbour
  std::unique_ptr<PipeOut> out_;  // to the right neighbour
  bool left_heard_ = false;       // a valid message arrived: the left neighbour is connected
  bool left_gone_ = false;
  int64_t dropped_ = 0;  // malformed messages ignored
  uint32_t seq_ = 0;     // collective sequence number, checked on every message
  int64_t bytes_sent_ = 0;
  std::vector<uint8_t> scratch_;
  RateLimiter limiter_;
};

}  // namespace shoal
