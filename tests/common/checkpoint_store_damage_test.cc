// A checkpoint store whose files were damaged after a commit (a log cut short or garbled,
// CURRENT or the MANIFEST deleted, a table file cut short) either still has its committed
// checkpoint or refuses to open naming the folder and what is wrong: it never opens as an
// empty store, which `--resume` would take for "no checkpoint yet" and start over.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "common/checkpoint/checkpoint_store.h"
#include "common/error.h"

namespace shoal {
namespace {

namespace fs = std::filesystem;

std::string Dir(const std::string& name) {
  return ::testing::TempDir() + "/store_damage_" + name + "_" + std::to_string(getpid()) + "/shard-0";
}

CheckpointState State(uint64_t id) {
  CheckpointState st;
  st.record.id = id;
  st.record.step = int64_t(id) * 10;
  st.record.shards = 1;
  st.entries["w"] = std::string(4096, char('a' + id));
  st.entries["b"] = "bias-" + std::to_string(id);
  return st;
}

// Checkpoints 1 and 2 written, 2 committed, a note put: what a running job leaves.
void Fill(const std::string& dir) {
  CheckpointStore s(dir, "shard 0", CheckpointStart::kFresh);
  s.WriteState(State(1), 0);
  s.Commit(State(1).record);
  s.WriteState(State(2), 1);
  s.Commit(State(2).record);
  s.PutNote("generation", "3");
}

std::vector<fs::path> Files(const std::string& dir, const std::string& ext) {
  std::vector<fs::path> out;
  for (auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ext) out.push_back(e.path());
  return out;
}

void ExpectIntact(const std::string& dir) {
  CheckpointStore s(dir, "shard 0", CheckpointStart::kResume);
  EXPECT_EQ(s.Committed().id, 2u);
  EXPECT_EQ(s.Committed().step, 20);
  CheckpointState st = s.Read(2);
  EXPECT_EQ(st.entries, State(2).entries);
  EXPECT_EQ(s.Note("generation").value_or(""), "3");
}

// The message of the error opening `dir` throws (an InputError: the process exits 2).
std::string OpenError(const std::string& dir) {
  try {
    CheckpointStore s(dir, "shard 0", CheckpointStart::kResume);
    CheckpointRecord c = s.Committed();
    s.Read(c.id);
  } catch (const InputError& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("not an InputError: ") + e.what();
  }
  return "opened";
}

TEST(CheckpointStoreDamage, ALogCutInHalfLosesNoCommittedCheckpoint) {
  const std::string dir = Dir("cut_log");
  Fill(dir);
  for (const fs::path& log : Files(dir, ".log")) fs::resize_file(log, fs::file_size(log) / 2);
  ExpectIntact(dir);
}

TEST(CheckpointStoreDamage, AGarbledLogLosesNoCommittedCheckpoint) {
  const std::string dir = Dir("garbled_log");
  Fill(dir);
  for (const fs::path& log : Files(dir, ".log")) {
    const uintmax_t size = fs::file_size(log);
    std::fstream f(log, std::ios::in | std::ios::out | std::ios::binary);
    for (uintmax_t at = size / 3; at < size && at < size / 3 + 64; ++at) {
      f.seekp(std::streamoff(at));
      f.put(char(0x5a));
    }
  }
  ExpectIntact(dir);
}

TEST(CheckpointStoreDamage, CommittedCheckpointsLiveInTableFilesNotTheLog) {
  const std::string dir = Dir("in_tables");
  Fill(dir);
  uintmax_t log_bytes = 0;
  for (const fs::path& log : Files(dir, ".log")) log_bytes += fs::file_size(log);
  EXPECT_EQ(log_bytes, 0u);  // nothing acknowledged waits in the log
  EXPECT_FALSE(Files(dir, ".sst").empty());
}

// A process killed while first creating its store leaves a MANIFEST but no CURRENT and
// nothing kept: that store opens afresh (a restarted job goes on) instead of being refused.
TEST(CheckpointStoreDamage, AStoreKilledWhileBeingCreatedOpensAfresh) {
  const std::string dir = Dir("half_created");
  { CheckpointStore s(dir, "shard 0", CheckpointStart::kFresh); }
  fs::remove(fs::path(dir) / "CURRENT");
  CheckpointStore s(dir, "shard 0", CheckpointStart::kResume);
  EXPECT_EQ(s.Committed().id, 0u);
  s.WriteState(State(1), 0);
  s.Commit(State(1).record);
  EXPECT_EQ(s.Committed().id, 1u);
}

TEST(CheckpointStoreDamage, AMissingCurrentFileIsNamedNotAnEmptyStore) {
  const std::string dir = Dir("no_current");
  Fill(dir);
  fs::remove(fs::path(dir) / "CURRENT");
  const std::string e = OpenError(dir);
  EXPECT_NE(e.find(dir + " is damaged"), std::string::npos) << e;
  EXPECT_NE(e.find("CURRENT file is missing"), std::string::npos) << e;
  EXPECT_NE(e.find("--fresh"), std::string::npos) << e;
  // Refused again, not turned into an empty store by the first attempt.
  EXPECT_EQ(OpenError(dir), e);
}

TEST(CheckpointStoreDamage, AMissingManifestIsNamed) {
  const std::string dir = Dir("no_manifest");
  Fill(dir);
  for (auto& f : fs::directory_iterator(dir))
    if (f.path().filename().string().rfind("MANIFEST-", 0) == 0) fs::remove(f.path());
  const std::string e = OpenError(dir);
  EXPECT_NE(e.find(dir + " is damaged"), std::string::npos) << e;
  EXPECT_NE(e.find("MANIFEST"), std::string::npos) << e;
}

TEST(CheckpointStoreDamage, ATableFileCutShortIsNamed) {
  const std::string dir = Dir("cut_sst");
  Fill(dir);
  std::vector<fs::path> ssts = Files(dir, ".sst");
  ASSERT_FALSE(ssts.empty());
  for (const fs::path& sst : ssts) fs::resize_file(sst, fs::file_size(sst) / 2);
  const std::string e = OpenError(dir);
  EXPECT_NE(e.find(dir + " is damaged"), std::string::npos) << e;
  EXPECT_NE(e.find(".sst"), std::string::npos) << e;
}

TEST(CheckpointStoreDamage, AnUndamagedStoreReopensAndKeepsWriting) {
  const std::string dir = Dir("ok");
  Fill(dir);
  ExpectIntact(dir);
  {
    CheckpointStore s(dir, "shard 0", CheckpointStart::kResume);
    s.WriteState(State(3), 2);
    s.Commit(State(3).record);
  }
  CheckpointStore s(dir, "shard 0", CheckpointStart::kResume);
  EXPECT_EQ(s.Committed().id, 3u);
  EXPECT_EQ(s.Read(3).entries, State(3).entries);
}

}  // namespace
}  // namespace shoal
