#include "tests/algorithms/fake_communicator.h"

#include <chrono>
#include <cstring>
#include <exception>
#include <thread>

#include "common/error.h"

namespace shoal {

void FakeGroup::Arrive(std::unique_lock<std::mutex>& lock) {
  uint64_t gen = generation_;
  if (++arrived_ == size_) {
    arrived_ = 0;
    ++generation_;
    cv_.notify_all();
    return;
  }
  if (!cv_.wait_for(lock, std::chrono::milliseconds(timeout_ms_), [&] { return generation_ != gen; }))
    throw Error("fake communicator: not every rank arrived within " + std::to_string(timeout_ms_) + " ms");
}

void FakeGroup::Exchange(int rank, std::vector<uint8_t> mine,
                         const std::function<void(const std::vector<std::vector<uint8_t>>&)>& combine) {
  std::unique_lock<std::mutex> lock(mu_);
  slots_[size_t(rank)] = std::move(mine);
  Arrive(lock);  // every deposit is in
  combine(slots_);
  Arrive(lock);  // everyone has read them: the slots may be reused
}

void FakeCommunicator::AllReduce(float* data, int64_t n, ReduceOp op, DType wire) {
  std::vector<uint8_t> mine(size_t(n) * 4);
  if (n > 0) memcpy(mine.data(), data, mine.size());  // an empty bucket may come as nullptr
  const int N = size();
  group_->Exchange(rank_, std::move(mine), [&](const std::vector<std::vector<uint8_t>>& all) {
    std::vector<float> in(static_cast<size_t>(n)), sum(static_cast<size_t>(n), 0.f);
    std::vector<uint8_t> enc(size_t(n) * DTypeSize(wire));
    for (const auto& slot : all) {
      if (n > 0) memcpy(in.data(), slot.data(), slot.size());
      if (wire != DType::kF32) {  // what the wire would carry
        EncodeFloats(in.data(), size_t(n), wire, enc.data());
        DecodeFloats(enc.data(), size_t(n), wire, in.data());
      }
      for (int64_t i = 0; i < n; ++i) sum[size_t(i)] += in[size_t(i)];
    }
    if (op == ReduceOp::kMean)
      for (auto& x : sum) x /= float(N);
    if (n > 0) memcpy(data, sum.data(), size_t(n) * 4);
  });
  bytes_sent_ += 2 * (N - 1) * n * int64_t(DTypeSize(wire)) / N;
}

void FakeCommunicator::AllGather(const void* in, int64_t bytes, void* out) {
  if (bytes <= 0) return;  // as the ring: nothing to gather (in and out may be null)
  std::vector<uint8_t> mine(static_cast<const uint8_t*>(in), static_cast<const uint8_t*>(in) + bytes);
  group_->Exchange(rank_, std::move(mine), [&](const std::vector<std::vector<uint8_t>>& all) {
    for (size_t r = 0; r < all.size(); ++r) {
      SHOAL_CHECK(int64_t(all[r].size()) == bytes, "fake all-gather: ranks passed different sizes");
      memcpy(static_cast<uint8_t*>(out) + int64_t(r) * bytes, all[r].data(), size_t(bytes));
    }
  });
  bytes_sent_ += (size() - 1) * bytes;
}

void FakeCommunicator::Broadcast(void* data, int64_t bytes, int root) {
  std::vector<uint8_t> mine;
  if (rank_ == root) mine.assign(static_cast<uint8_t*>(data), static_cast<uint8_t*>(data) + bytes);
  group_->Exchange(rank_, std::move(mine), [&](const std::vector<std::vector<uint8_t>>& all) {
    SHOAL_CHECK(int64_t(all[size_t(root)].size()) == bytes, "fake broadcast: ranks passed different sizes");
    memcpy(data, all[size_t(root)].data(), size_t(bytes));
  });
  if (rank_ == root) bytes_sent_ += bytes;
}

void FakeCommunicator::Barrier() {
  group_->Exchange(rank_, {}, [](const std::vector<std::vector<uint8_t>>&) {});
}

std::unique_ptr<Communicator> FakeCluster::Join(const std::string& name, int rank) {
  std::lock_guard<std::mutex> lock(mu_);
  auto& g = groups_[name];
  if (!g) g = std::make_shared<FakeGroup>(world_);
  return std::make_unique<FakeCommunicator>(rank, g);
}

std::vector<std::string> FakeCluster::GroupNames() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> names;
  for (auto& [name, group] : groups_) names.push_back(name);
  return names;
}

AlgorithmEnv FakeCluster::EnvFor(const JobConfig& cfg, int rank, int64_t steps_per_epoch) {
  AlgorithmEnv env;
  env.config = &cfg;
  env.rank = rank;
  env.world = world_;
  env.steps_per_epoch = steps_per_epoch;
  env.total_steps = cfg.epochs * steps_per_epoch;
  env.optimizer = MakeOptimizer(cfg.optimizer, cfg.optimizer_opts);
  env.schedule = std::make_shared<LrSchedule>(
      LrSchedule::FromConfig(cfg.optimizer_opts, cfg.batch_size * world_, steps_per_epoch, env.total_steps));
  env.make_communicator = [this, rank](const std::string& name) { return Join(name, rank); };
  return env;
}

std::vector<ParamView> OneTensor(std::vector<float>& w, std::vector<float>& g) {
  ParamView p;
  p.name = "w";
  p.w = w.data();
  p.g = g.data();
  p.n = int64_t(w.size());
  p.shape = {p.n};
  return {p};
}

void RunRankThreads(int world, const std::function<void(int rank)>& fn) {
  std::vector<std::exception_ptr> errors(static_cast<size_t>(world));
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r)
    threads.emplace_back([&, r] {
      try {
        fn(r);
      } catch (...) {
        errors[size_t(r)] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

}  // namespace shoal
