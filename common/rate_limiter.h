// Token bucket on a worker's sends: reproduces a slow link on one machine. Send(bytes)
// sleeps until the bytes fit under `bytes_per_s` (burst of 50 ms worth).
#pragma once
#include <algorithm>
#include <chrono>
#include <mutex>
#include <thread>

namespace shoal {

class RateLimiter {
 public:
  explicit RateLimiter(double bytes_per_s = 0) : rate_(bytes_per_s) {}
  bool enabled() const { return rate_ > 0; }
  void Acquire(double bytes) {
    if (rate_ <= 0) return;
    std::unique_lock<std::mutex> lock(mu_);
    auto now = std::chrono::steady_clock::now();
    double burst = rate_ * 0.05;
    tokens_ = std::min(burst, tokens_ + rate_ * std::chrono::duration<double>(now - last_).count());
    last_ = now;
    tokens_ -= bytes;
    if (tokens_ < 0) {
      double wait = -tokens_ / rate_;
      lock.unlock();
      std::this_thread::sleep_for(std::chrono::duration<double>(wait));
    }
  }

 private:
  double rate_;
  double tokens_ = 0;
  std::chrono::steady_clock::time_point last_ = std::chrono::steady_clock::now();
  std::mutex mu_;
};

}  // namespace shoal
