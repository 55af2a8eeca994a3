// One-GPU jobs through the launcher (skipped, saying why, without a CUDA device): allreduce
// over NCCL takes device params, so its loss falls with no host<->device parameter copy
// on the step path (param_copy_bytes_per_step 0, device_params true), and a checkpoint
// written from device weights and states resumes to the same end as the run that never
// stopped; the same job under "local" (host mirrors) shows what the copies were; and a
// precision = "bf16" resnet20 (the CUDA backend's mixed mode) learns; overlapped NCCL
// buckets (gradients handed over behind CUDA events) give the step path's weights.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "common/cuda/platform.h"
#include "common/json_fields.h"
#include "tests/training/job_runner.h"

namespace shoal {
namespace testing {
namespace {

// Counted in a child: the test then forks the launcher without a CUDA context of its own.
int CudaDevices() {
  pid_t p = fork();
  if (p == 0) _exit(std::min(CudaDeviceCount(nullptr), 100));
  int st = 0;
  waitpid(p, &st, 0);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 0;
}

std::string GpuJob(const std::string& name, const std::string& dir, const std::string& algorithm) {
  return "[job]\nname = \"" + name + "\"\nseed = 7\noutput_dir = \"" + dir + "/out\"\ncheckpoint_dir = \"" + dir +
         "/ckpt\"\ncheckpoint_every_steps = 40\n\n[cluster]\nworkers = [{device = \"cuda:0\"}]\n\n"
         "[model]\nname = \"mlp\"\n\n[data]\nformat = \"synthetic\"\nsynthetic_samples = 1024\nimage_size = 8\n"
         "classes = 10\nbatch_size = 32\nmax_test_samples = 256\n\n[algorithm]\n" +
         algorithm +
         "\n\n[optimizer]\nname = \"momentum\"\nlr = 0.05\nmomentum = 0.9\nweight_decay = 1e-4\n\n"
         "[train]\nepochs = 3\nthreads = 1\nlog_every_steps = 8\n";
}

TEST(GpuTraining, AllReduceKeepsParamsOnTheDeviceAndLearns) {
  if (CudaDevices() < 1) GTEST_SKIP() << "no CUDA device on this machine";
  std::string dir = FreshDir("gpu_allreduce");
  JobRun r = RunJob(dir, GpuJob("gpu-allreduce", dir, "name = \"allreduce\"\ncollective = \"nccl\""), 300);
  ASSERT_EQ(r.exit_code, 0) << r.stderr_text;
  auto train = Events(r, "train");
  ASSERT_GE(train.size(), 4u) << r.stdout_text;
  for (auto& t : train) {
    EXPECT_EQ(JsonNumber(t, "param_copy_bytes_per_step").value_or(-1), 0) << t;
    EXPECT_EQ(JsonField(t, "device_params").value_or("?"), "true") << t;
  }
  double first = JsonNumber(train.front(), "loss").value_or(0), last = JsonNumber(train.back(), "loss").value_or(1e9);
  EXPECT_LT(last, 0.7 * first) << train.front() << "\n" << train.back();
  std::string hash = JsonField(Events(r, "end").at(0), "weights_hash").value_or("?");

  // Resumed from its step-40 checkpoint (device weights and optimizer states saved through
  // host copies): the same final weights as the uninterrupted run.
  JobRun again =
      RunJob(dir, GpuJob("gpu-allreduce", dir, "name = \"allreduce\"\ncollective = \"nccl\""), 300, {"--resume"});
  ASSERT_EQ(again.exit_code, 0) << again.stderr_text;
  auto resumes = Events(again, "resume");
  ASSERT_FALSE(resumes.empty()) << again.stderr_text;
  EXPECT_GE(JsonNumber(resumes.back(), "step").value_or(-1), 40) << resumes.back();
  auto ends = Events(again, "end");
  ASSERT_FALSE(ends.empty()) << again.stdout_text;
  // The CUDA engine and optimizers use no atomics (the same bits run to run), so a
  // difference here is the checkpoint's, not the GPU's.
  EXPECT_EQ(JsonField(ends.back(), "weights_hash").value_or("!"), hash);
}

// Overlap on device params: each final gradient goes to the exchange behind a CUDA event
// (no host wait on the backend's stream; common/device_fence.h), and the buckets then leave
// during the backward pass. Same bits as the run without overlap, so the ordering held.
TEST(GpuTraining, OverlappedNcclBucketsGiveTheSameWeightsAsTheStepPath) {
  if (CudaDevices() < 1) GTEST_SKIP() << "no CUDA device on this machine";
  std::string hashes[2];
  for (int overlap = 0; overlap < 2; ++overlap) {
    std::string dir = FreshDir(overlap ? "gpu_overlap_on" : "gpu_overlap_off");
    std::string algo = std::string("name = \"allreduce\"\ncollective = \"nccl\"\nbucket_bytes = 1024\noverlap = ") +
                       (overlap ? "true" : "false");
    JobRun r = RunJob(dir, GpuJob("gpu-overlap", dir, algo), 300);
    ASSERT_EQ(r.exit_code, 0) << r.stderr_text;
    auto train = Events(r, "train");
    ASSERT_FALSE(train.empty()) << r.stdout_text;
    double early = JsonNumber(train.back(), "overlapped_buckets").value_or(-1);
    if (overlap)
      EXPECT_GE(early, 1) << train.back();
    else
      EXPECT_EQ(early, 0) << train.back();
    hashes[overlap] = JsonField(Events(r, "end").at(0), "weights_hash").value_or(overlap ? "!" : "?");
  }
  EXPECT_EQ(hashes[1], hashes[0]);
}

TEST(GpuTraining, HostMirrorsAreCountedWhereTheAlgorithmTakesHostParams) {
  if (CudaDevices() < 1) GTEST_SKIP() << "no CUDA device on this machine";
  std::string dir = FreshDir("gpu_local");
  JobRun r = RunJob(dir, GpuJob("gpu-local", dir, "name = \"local\""), 300);
  ASSERT_EQ(r.exit_code, 0) << r.stderr_text;
  auto train = Events(r, "train");
  ASSERT_FALSE(train.empty()) << r.stdout_text;
  for (auto& t : train) {
    EXPECT_GT(JsonNumber(t, "param_copy_bytes_per_step").value_or(0), 0) << t;
    EXPECT_EQ(JsonField(t, "device_params").value_or("?"), "false") << t;
  }
}

// [model] precision = "bf16" on a CUDA worker: resnet20's convolutions and its fully
// connected layer run on tensor cores from bf16 copies (NHWC), everything else in fp32; on
// CIFAR-shaped synthetic data (3x32x32, labels drawn from a small pool it can memorize) the
// loss falls as it does in fp32.
TEST(GpuTraining, Bf16Resnet20Learns) {
  if (CudaDevices() < 1) GTEST_SKIP() << "no CUDA device on this machine";
  std::string dir = FreshDir("gpu_bf16");
  std::string job = GpuJob("gpu-bf16", dir, "name = \"local\"");
  job.replace(job.find("name = \"mlp\""), 12, "name = \"resnet20\"\nprecision = \"bf16\"");
  job.replace(job.find("image_size = 8"), 14, "image_size = 32");
  JobRun r = RunJob(dir, job, 300);
  ASSERT_EQ(r.exit_code, 0) << r.stderr_text;
  auto train = Events(r, "train");
  ASSERT_GE(train.size(), 4u) << r.stdout_text;
  double first = JsonNumber(train.front(), "loss").value_or(0), last = JsonNumber(train.back(), "loss").value_or(1e9);
  EXPECT_TRUE(std::isfinite(last)) << train.back();
  EXPECT_LT(last, 0.7 * first) << train.front() << "\n" << train.back();
}

// precision = "fp16" with dynamic loss scaling and overlapped NCCL buckets, end to end: the
// scale starts far above fp16's range, so the first steps overflow; each such step must be
// skipped on every path (the buckets already sent during that backward pass included) and
// the scale halved until it fits, after which resnet20 learns as in fp32. On an H200 it settled
// near 1e6: 1e8 costs about 7 of the job's 160 steps (1e30 took 79 and 1e12 23, leaving too few).
TEST(GpuTraining, Fp16DynamicLossScalingWithOverlapSkipsOverflowsAndLearns) {
  if (CudaDevices() < 1) GTEST_SKIP() << "no CUDA device on this machine";
  std::string dir = FreshDir("gpu_fp16_overlap");
  std::string job =
      GpuJob("gpu-fp16", dir, "name = \"allreduce\"\ncollective = \"nccl\"\nbucket_bytes = 65536\noverlap = true");
  job.replace(job.find("name = \"mlp\""), 12,
              "name = \"resnet20\"\nprecision = \"fp16\"\nloss_scale_init = 1e8\nloss_scale_growth_interval = 20");
  job.replace(job.find("image_size = 8"), 14, "image_size = 32");
  job.replace(job.find("epochs = 3"), 10, "epochs = 5");  // 160 steps: the skipped ones and enough to learn in
  JobRun r = RunJob(dir, job, 300);
  ASSERT_EQ(r.exit_code, 0) << r.stderr_text;
  auto train = Events(r, "train");
  ASSERT_GE(train.size(), 4u) << r.stdout_text;
  const std::string end = Events(r, "end").at(0);
  EXPECT_GE(JsonNumber(end, "skipped_steps").value_or(0), 1) << end;
  const double scale = JsonNumber(end, "loss_scale").value_or(1e8);
  EXPECT_LT(scale, 1e8 / 16) << end;  // halved at least four times more than it grew
  EXPECT_GE(scale, 1.0) << end;
  EXPECT_GT(JsonNumber(train.back(), "overlapped_buckets").value_or(0), 0) << train.back();
  double first = JsonNumber(train.front(), "loss").value_or(0), last = JsonNumber(train.back(), "loss").value_or(1e9);
  EXPECT_TRUE(std::isfinite(last)) << train.back();
  EXPECT_LT(last, 0.7 * first) << train.front() << "\n" << train.back();
}

}  // namespace
}  // namespace testing
}  // namespace shoal
