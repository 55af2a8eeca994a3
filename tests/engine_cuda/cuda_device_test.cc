// The CUDA backend on a machine without a usable device: a clear shoal::Error naming the
// driver's reason, never a crash. Needs no CPU engine, so it runs on every build machine.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/error.h"
#include "common/cuda/platform.h"
#include "worker/engine/backend.h"

namespace shoal {
namespace {

TEST(CudaDevice, MissingDeviceIsReportedNotFatal) {
  std::string why;
  const int n = CudaDeviceCount(&why);
  if (n > 0) GTEST_SKIP() << "a CUDA device is present (" << why << ")";
  EXPECT_FALSE(why.empty());
  try {
    MakeCudaBackend(0);
    FAIL() << "MakeCudaBackend succeeded without a device";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.find("no CUDA device"), 0u) << msg;
    EXPECT_NE(msg.find(why), std::string::npos) << msg;
  }
}

// What the machine lacks (no device or driver, a device index beyond those present) is the
// job's input on this machine, the same on every retry: shoal::Error, which a worker's
// start-up reports as InputError (exit 2). Anything else CUDA says (out of memory, a busy or
// failed device, a launch failure) may pass: TransientError, exit 1, so a launcher restarts.
TEST(CudaDevice, MissingDevicesArePermanentOtherFailuresTransient) {
  for (cudaError_t e : {cudaErrorNoDevice, cudaErrorInsufficientDriver, cudaErrorInvalidDevice}) {
    EXPECT_TRUE(CudaErrorIsPermanent(e)) << cudaGetErrorString(e);
    try {
      CheckCuda(e, "here");
      FAIL() << "no throw";
    } catch (const TransientError& t) {
      ADD_FAILURE() << "transient: " << t.what();
    } catch (const Error&) {
    }
  }
  for (cudaError_t e : {cudaErrorMemoryAllocation, cudaErrorDevicesUnavailable, cudaErrorLaunchFailure,
                        cudaErrorECCUncorrectable, cudaErrorSystemNotReady}) {
    EXPECT_FALSE(CudaErrorIsPermanent(e)) << cudaGetErrorString(e);
    EXPECT_THROW(CheckCuda(e, "here"), TransientError) << cudaGetErrorString(e);
  }
  // A device's absence on this machine stays permanent.
  std::string why;
  if (CudaDeviceCount(&why) > 0) return;
  bool transient = true;
  CudaDeviceCount(&why, &transient);
  EXPECT_FALSE(transient) << why;
  try {
    MakeCudaBackend(0);
  } catch (const TransientError& t) {
    ADD_FAILURE() << "transient: " << t.what();
  } catch (const Error&) {
  }
}

// The mixed-precision backend: without a device the only complaint is the missing device.
TEST(CudaDevice, MixedPrecisionBackendIsBuilt) {
  std::string why;
  if (CudaDeviceCount(&why) > 0) {
    for (DType dt : {DType::kBF16, DType::kF16}) EXPECT_EQ(MakeCudaBackend(0, dt)->compute_dtype(), dt);
    return;
  }
  for (DType dt : {DType::kBF16, DType::kF16}) {
    try {
      MakeCudaBackend(0, dt);
      FAIL() << "MakeCudaBackend succeeded without a device";
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()).find("no CUDA device"), 0u) << e.what();
    }
  }
}

TEST(CudaDevice, BadIndexThrows) {
  EXPECT_THROW(MakeCudaBackend(-1), Error);
  EXPECT_THROW(MakeCudaBackend(1 << 20), Error);
}

TEST(CudaDevice, MemoryRoundTripWhenPresent) {
  std::string why;
  if (CudaDeviceCount(&why) == 0) GTEST_SKIP() << "no CUDA device: " << why;
  auto b = MakeCudaBackend(0);
  EXPECT_EQ(b->Name().rfind("cuda:0/", 0), 0u) << b->Name();
  Tensor t = b->Empty({3, 5});
  b->Fill(t, 2.f);
  b->Scale(1.5f, t);
  std::vector<float> h(15, 0.f);
  b->CopyToHost(t, h.data());
  EXPECT_EQ(h, std::vector<float>(15, 3.f));
  EXPECT_DOUBLE_EQ(b->SumSquares(t), 135.0);
}

}  // namespace
}  // namespace shoal
