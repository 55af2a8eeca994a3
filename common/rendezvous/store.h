// Rendezvous store: ranks publish small values (their endpoints) and wait for others'.
// Behind one interface (as gloo does) so collectives never care how peers met: a shared
// directory (tests, Slurm jobs on a shared filesystem) or the coordinator.
#pragma once
#include <string>

namespace shoal {

class Store {
 public:
  virtual ~Store() = default;
  virtual void Set(const std::string& key, const std::string& value) = 0;
  // Waits up to timeout_ms; throws shoal::Error naming the key on timeout.
  virtual std::string Get(const std::string& key, int timeout_ms) = 0;
};

// Keys are files in a directory; writes are atomic (write to a temp name, rename).
class FileStore : public Store {
 public:
  explicit FileStore(std::string dir);
  void Set(const std::string& key, const std::string& value) override;
  std::string Get(const std::string& key, int timeout_ms) override;

 private:
  std::string dir_;
};

}  // namespace shoal
