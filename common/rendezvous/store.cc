#include "common/rendezvous/store.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

#include "common/error.h"
#include "common/metrics.h"

namespace shoal {

FileStore::FileStore(std::string dir) : dir_(std::move(dir)) { MakeDirs(dir_); }

namespace {

std::string RandomToken() {
  std::random_device rd;
  std::mt19937_64 g((uint64_t(rd()) << 32) ^ rd() ^ uint64_t(getpid()) ^
                    uint64_t(std::chrono::steady_clock::now().time_since_epoch().count()));
  char buf[40];
  snprintf(buf, sizeof(buf), "%016llx%016llx", (unsigned long long)g(), (unsigned long long)g());
  return buf;
}

bool ReadWhole(const std::string& path, std::string* out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  std::ostringstream ss;
  ss << in.rdbuf();
  *out = ss.str();
  return true;
}

// Atomic publish; false when the directory entry could not be made (rank 0 clearing).
bool WriteAtomic(const std::string& dir, const std::string& name, const std::string& value) {
  std::string tmp = dir + "/.tmp." + name + "." + std::to_string(getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << value;
    if (!out) return false;
  }
  return rename(tmp.c_str(), (dir + "/" + name).c_str()) == 0;
}

void RemoveTree(const std::string& path) {
  if (DIR* d = opendir(path.c_str())) {
    while (dirent* e = readdir(d)) {
      std::string n = e->d_name;
      if (n != "." && n != "..") unlink((path + "/" + n).c_str());
    }
    closedir(d);
  }
  rmdir(path.c_str());
}

// Rank 0: everything an earlier run left (generations, joins, its `gen`) goes; files
// still being written (.tmp.*) stay.
void ClearForNewRun(const std::string& dir) {
  DIR* d = opendir(dir.c_str());
  if (!d) throw Error(dir + ": cannot list rendezvous directory: " + strerror(errno));
  std::vector<std::string> names;
  while (dirent* e = readdir(d)) names.push_back(e->d_name);
  closedir(d);
  for (auto& n : names) {
    if (n == "." || n == ".." || n.rfind(".tmp.", 0) == 0) continue;
    if (n.rfind("gen-", 0) == 0)
      RemoveTree(dir + "/" + n);
    else
      unlink((dir + "/" + n).c_str());
  }
}

}  // namespace

FileStore::FileStore(std::string dir, const FileStoreRun& run) {
  MakeDirs(dir);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(run.timeout_ms);
  auto sleep = [] { std::this_thread::sleep_for(std::chrono::milliseconds(10)); };
  if (run.rank == 0) {
    ClearForNewRun(dir);
    const std::string gen = RandomToken();
    MakeDirs(dir + "/gen-" + gen);
    std::string listing = gen + "\n";
    for (int r = 1; r < run.world; ++r) {
      std::string token;
      while (!ReadWhole(dir + "/join." + std::to_string(r), &token) || token.empty()) {
        if (std::chrono::steady_clock::now() > deadline)
          throw Error("rendezvous: rank " + std::to_string(r) + " did not join " + dir + " within " +
                      std::to_string(run.timeout_ms) + " ms (did that rank start, with the same rendezvous_dir?)");
        sleep();
      }
      listing += std::to_string(r) + " " + token + "\n";
    }
    if (!WriteAtomic(dir, "gen", listing)) throw Error(dir + "/gen: cannot publish rendezvous generation");
    dir_ = dir + "/gen-" + gen;
    return;
  }
  const std::string token = RandomToken(), join = "join." + std::to_string(run.rank);
  const std::string mine = "\n" + std::to_string(run.rank) + " " + token + "\n";
  std::string listing, seen;
  for (;;) {
    // Rank 0 deletes every join when it starts, this one too if it came first: publish
    // again until a generation lists it.
    if (!ReadWhole(dir + "/" + join, &seen) || seen != token) WriteAtomic(dir, join, token);
    if (ReadWhole(dir + "/gen", &listing) && listing.find(mine) != std::string::npos) break;
    if (std::chrono::steady_clock::now() > deadline)
      throw Error("rendezvous: rank 0 did not claim " + dir + " for this run within " + std::to_string(run.timeout_ms) +
                  " ms (did rank 0 start, with the same rendezvous_dir?)");
    sleep();
  }
  dir_ = dir + "/gen-" + listing.substr(0, listing.find('\n'));
}

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

std::string FileStore::CompareSet(const std::string& key, const std::string& expected, const std::string& desired) {
  CheckKey(key);
  const std::string lock_path = dir_ + "/.lock";
  int fd = open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) throw Error(lock_path + ": cannot open rendezvous lock: " + strerror(errno));
  while (flock(fd, LOCK_EX) != 0) {
    if (errno == EINTR) continue;
    const std::string why = strerror(errno);
    close(fd);
    throw Error(lock_path + ": cannot lock: " + why);
  }
  std::string held;
  const bool present = ReadWhole(dir_ + "/" + key, &held);
  try {
    if ((present ? held : std::string()) == expected) {
      Set(key, desired);
      held = desired;
    }
  } catch (...) {
    close(fd);  // releases the lock
    throw;
  }
  close(fd);
  return held;
}

}  // namespace shoal
