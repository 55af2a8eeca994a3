#include "common/rendezvous/store.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <thread>

#include "common/error.h"
#include "common/metrics.h"

namespace shoal {

FileStore::FileStore(std::string dir) : dir_(std::move(dir)) { MakeDirs(dir_); }

static void CheckKey(const std::string& key) {
  if (key.empty() || key.find('/') != std::string::npos || key[0] == '.')
    throw Error("store key \"" + key + "\": must be non-empty, without '/' and not start with '.'");
}

void FileStore::Set(const std::string& key, const std::string& value) {
  CheckKey(key);
  std::string tmp = dir_ + "/.tmp." + key + "." + std::to_string(getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << value;
    if (!out) throw Error(tmp + ": cannot write rendezvous file");
  }
  if (rename(tmp.c_str(), (dir_ + "/" + key).c_str()) != 0)
    throw Error(dir_ + "/" + key + ": cannot publish rendezvous file");
}

std::string FileStore::Get(const std::string& key, int timeout_ms) {
  CheckKey(key);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (true) {
    std::ifstream in(dir_ + "/" + key, std::ios::binary);
    if (in) {
      std::ostringstream ss;
      ss << in.rdbuf();
      return ss.str();
    }
    if (std::chrono::steady_clock::now() > deadline)
      throw Error("rendezvous: no value for \"" + key + "\" in " + dir_ + " after " + std::to_string(timeout_ms) +
                  " ms (did that rank start?)");
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

}  // namespace shoal
