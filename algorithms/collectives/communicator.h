// Communicator: collectives among the workers of a job. Implementations: a ZeroMQ ring
// (CPUs, across hosts), NCCL (GPUs). Buffers are host memory, except that a communicator
// whose HandlesDeviceBuffers() is true (NCCL) also takes pointers into the device memory of
// its rank's GPU and works on them in place; the caller must have finished (synchronized)
// the work that writes them, and the data is on the device when the call returns. `wire`
// picks the dtype on the wire (fp16/bf16 halves the bytes; the result is still identical
// on every rank, and the same bits for host and device buffers).
#pragma once
#include <cstdint>
#include <string>

#include "algorithms/compressors/block_quant.h"
#include "common/dtype.h"

namespace shoal {

enum class ReduceOp { kSum, kMean };

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string Name() const = 0;
  // True when AllReduce / AllGather / Broadcast accept device pointers (see above).
  virtual bool HandlesDeviceBuffers() const { return false; }
  // In place; every rank ends with the same values, bit for bit.
  virtual void AllReduce(float* data, int64_t n, ReduceOp op, DType wire = DType::kF32) = 0;
  // The same with block-scaled int8/int4 on the wire (algorithms/compressors/block_quant.h),
  // host buffers only: every rank ends with the same values, bit for bit, each within the
  // encoding's rounding of the exact result. This default all-gathers each rank's own
  // encoding and every rank decodes and sums them in rank order (each rank sends size() - 1
  // encodings); the ring overrides it with a reduction hop by hop (2(N-1)/N of one encoding,
  // partial sums re-encoded at each hop).
  virtual void AllReduceQuantized(float* data, int64_t n, ReduceOp op, BlockQuant q);
  // Each rank contributes `bytes` bytes; out gets size() * bytes, rank order. Every rank
  // passes the same `bytes`; 0 is a no-op (in and out may then be null).
  virtual void AllGather(const void* in, int64_t bytes, void* out) = 0;
  virtual void Broadcast(void* data, int64_t bytes, int root) = 0;
  virtual void Barrier() = 0;
  virtual int64_t bytes_sent() const = 0;
};

}  // namespace shoal
