// A device-order marker: "the work queued on one device stream so far". A CUDA backend
// makes one (a cudaEvent recorded on its stream) when a gradient is final, instead of
// waiting on the host for its whole stream; a CPU backend makes none (null: nothing to
// wait for, the work is done when the call returns).
//
// Ordering contract (device-resident params, docs/architecture.md):
//  - Whoever reads or writes memory the marked work wrote, on ANOTHER stream, first makes
//    that stream wait on the marker device-side (DeviceOps::After: cudaStreamWaitEvent),
//    never the host; host readers Wait() (or keep the backend's Synchronize).
//  - A marker only orders the work queued before it was recorded; work queued later on
//    the producer's stream (the rest of the backward pass) runs on, so the producer must not
//    write the marked memory again before its consumers are done: each gradient is final
//    when marked, and the next step's backward starts only after Step returned, by which
//    time every device op the algorithm queued has finished (DeviceOps calls and NCCL
//    collectives are complete on the device when they return).
//  - A marker that has passed costs nothing to wait on, so a stale one is harmless.
// Lives in common/ so that algorithms/ (consumers) and worker/ (producers) share it without
// CUDA: the native handle is opaque here.
#pragma once

namespace shoal {

class DeviceFence {
 public:
  virtual ~DeviceFence() = default;
  // The host waits until the marked work finished.
  virtual void Wait() const = 0;
  // The native handle (a cudaEvent_t on CUDA) for a consumer's stream wait.
  virtual void* native() const = 0;
};

}  // namespace shoal
