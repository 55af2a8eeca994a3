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
  // Sets `key` to `desired` only if it now holds `expected` ("" also matches a key not set)
  // and returns what the key holds afterwards, so that of several callers racing from one
  // value exactly one wins (it gets `desired` back) and the others learn the winner's value.
  virtual std::string CompareSet(const std::string& key, const std::string& expected, const std::string& desired) = 0;
};

// How the ranks of one run claim a shared directory that an earlier run may have used
// (workers started by hand all get run id "0"): rank 0 clears the directory and writes a
// fresh generation that lists a random token of every other rank; a rank uses only a
// generation that lists its own token, so an earlier run's values are never read.
struct FileStoreRun {
  int rank = 0;
  int world = 1;
  int timeout_ms = 120000;  // for all ranks to arrive
};

// Keys are files in a directory; writes are atomic (write to a temp name, rename).
// One run at a time per directory.
class FileStore : public Store {
 public:
  // A directory this run alone uses (tests): keys straight in `dir`.
  explicit FileStore(std::string dir);
  // A directory shared with earlier runs: blocks until the ranks agree on a generation
  // (see FileStoreRun); throws shoal::Error naming the directory and the missing ranks.
  FileStore(std::string dir, const FileStoreRun& run);
  void Set(const std::string& key, const std::string& value) override;
  std::string Get(const std::string& key, int timeout_ms) override;
  // Serialized by an flock on the directory's `.lock` file (processes on one host, or a
  // shared filesystem with working locks).
  std::string CompareSet(const std::string& key, const std::string& expected, const std::string& desired) override;
  // Where the keys live (the generation's directory for a shared one).
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
};

}  // namespace shoal
