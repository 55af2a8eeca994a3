// Token files (format "tokens"): windows and next-token labels, sharding and resume through
// the DataLoader, and the bad files a user meets (odd length, too short, an id past the vocabulary).
#include "worker/data/tokens_reader.h"

#include <algorithm>
#include <fstream>
#include <set>

#include <gtest/gtest.h>

#include "common/error.h"
#include "tests/data/test_files.h"
#include "worker/data/data_loader.h"

namespace shoal {
namespace {

using testdata::TempDir;

// n tokens, little-endian uint16, token k = k % mod (so a window's ids say where it started).
std::string WriteTokens(const TempDir& dir, const std::string& name, int64_t n, int mod = 1000) {
  std::vector<uint8_t> bytes;
  for (int64_t k = 0; k < n; ++k) {
    const uint16_t t = uint16_t(k % mod);
    bytes.push_back(uint8_t(t & 0xff));
    bytes.push_back(uint8_t(t >> 8));
  }
  testdata::WriteBytes(dir / name, bytes);
  return dir / name;
}

DatasetOptions Opts(int64_t seq_len, int64_t vocab) {
  DatasetOptions o;
  o.seq_len = seq_len;
  o.num_classes = vocab;
  return o;
}

std::string ErrorOf(const std::string& path, const DatasetOptions& o) {
  try {
    LoadDataset("tokens", path, o);
  } catch (const InputError& e) {
    return e.what();
  }
  return "(no InputError)";
}

TEST(TokensReader, WindowsAndNextTokenTargets) {
  TempDir dir;
  // 4 windows of 8 need 33 tokens; 40 tokens still give 4 (the partial fifth is dropped).
  const std::string path = WriteTokens(dir, "train.bin", 40);
  auto d = LoadDataset("tokens", path, Opts(8, 1000));
  ASSERT_TRUE(d->is_tokens());
  EXPECT_EQ(d->size(), 4);
  EXPECT_EQ(d->sample_shape(), std::vector<int64_t>({8}));
  EXPECT_EQ(d->labels_per_sample(), 8);
  EXPECT_EQ(d->num_classes(), 1000);
  for (int64_t i = 0; i < 4; ++i) {
    std::vector<float> x(8);
    std::vector<int32_t> y(8);
    d->WriteNormalized(i, x.data());
    d->WriteLabels(i, y.data());
    for (int64_t k = 0; k < 8; ++k) {
      EXPECT_EQ(x[size_t(k)], float(i * 8 + k));        // the ids themselves, unnormalized
      EXPECT_EQ(y[size_t(k)], int32_t(i * 8 + k + 1));  // the next token
    }
  }
  // Exactly seq_len + 1 tokens: one window. max_samples keeps the first windows.
  EXPECT_EQ(LoadDataset("tokens", WriteTokens(dir, "one.bin", 9), Opts(8, 1000))->size(), 1);
  DatasetOptions o = Opts(8, 1000);
  o.max_samples = 2;
  EXPECT_EQ(LoadDataset("tokens", path, o)->size(), 2);
  // Ids up to 65535 (the whole uint16 range) with vocab_size 65536.
  std::vector<uint8_t> hi = {0xff, 0xff, 0x00, 0x01, 0x34, 0x12};
  testdata::WriteBytes(dir / "hi.bin", hi);
  auto h = LoadDataset("tokens", dir / "hi.bin", Opts(2, 65536));
  std::vector<float> x(2);
  std::vector<int32_t> y(2);
  h->WriteNormalized(0, x.data());
  h->WriteLabels(0, y.data());
  EXPECT_EQ(x, std::vector<float>({65535.0f, 256.0f}));
  EXPECT_EQ(y, std::vector<int32_t>({256, 0x1234}));
}

// The lines of /proc/self/maps that map `path`.
int MapsOf(const std::string& path) {
  std::ifstream maps("/proc/self/maps");
  int n = 0;
  for (std::string line; std::getline(maps, line);)
    if (line.size() >= path.size() && line.compare(line.size() - path.size(), path.size(), path) == 0) ++n;
  return n;
}

// A GPT's token file is many GB: the data set maps it (the page cache holds it, shared among
// the host's workers) instead of copying it into the heap, and unmaps it when it goes.
TEST(TokensReader, TheFileIsMappedNotCopied) {
  TempDir dir;
  const std::string path = WriteTokens(dir, "train.bin", 1 << 20, 50000);
  EXPECT_EQ(MapsOf(path), 0);
  {
    auto d = LoadDataset("tokens", path, Opts(64, 50000));
    EXPECT_EQ(MapsOf(path), 1);
    EXPECT_EQ(d->size(), ((1 << 20) - 1) / 64);
    EXPECT_EQ(d->token_count(), 1 << 20);
    std::vector<float> x(64);
    std::vector<int32_t> y(64);
    const int64_t last = d->size() - 1;
    d->WriteNormalized(last, x.data());
    d->WriteLabels(last, y.data());
    EXPECT_EQ(x[0], float((last * 64) % 50000));
    EXPECT_EQ(y[63], int32_t((last * 64 + 64) % 50000));
    // max_samples: that many windows, the rest of the file never touched.
    DatasetOptions o = Opts(64, 50000);
    o.max_samples = 10;
    auto few = LoadDataset("tokens", path, o);
    EXPECT_EQ(few->size(), 10);
    EXPECT_EQ(few->token_count(), 11 * 64);
  }
  EXPECT_EQ(MapsOf(path), 0);
}

TEST(TokensReader, LoaderShardsEveryWindowOnceAndResumes) {
  TempDir dir;
  // 100 windows of 4 tokens; window i starts with token 4i.
  const std::string path = WriteTokens(dir, "train.bin", 401, 60000);
  auto d = LoadDataset("tokens", path, Opts(4, 60000));
  ASSERT_EQ(d->size(), 100);
  std::multiset<int64_t> seen;
  for (int r = 0; r < 2; ++r) {
    DataLoaderOptions lo;
    lo.batch_size = 5;
    lo.rank = r;
    lo.world_size = 2;
    lo.seed = 7;
    DataLoader l(d, lo);
    EXPECT_EQ(l.batches_per_epoch(), 10);
    l.StartEpoch(1);
    Batch b;
    while (l.Next(&b)) {
      ASSERT_EQ(int64_t(b.images.size()), b.n * 4);
      ASSERT_EQ(int64_t(b.labels.size()), b.n * 4);
      for (int64_t j = 0; j < b.n; ++j) {
        const int64_t start = int64_t(b.images[size_t(j * 4)]);
        EXPECT_EQ(start % 4, 0);
        for (int64_t k = 0; k < 4; ++k) {
          EXPECT_EQ(b.images[size_t(j * 4 + k)], float(start + k));
          EXPECT_EQ(b.labels[size_t(j * 4 + k)], int32_t(start + k + 1));
        }
        seen.insert(start / 4);
      }
    }
  }
  // Both ranks together: every window once, in a shuffled order.
  ASSERT_EQ(seen.size(), 100u);
  EXPECT_EQ(std::set<int64_t>(seen.begin(), seen.end()).size(), 100u);

  // Resume: a fresh loader seeked to a position gives the same batches from there on.
  DataLoaderOptions lo;
  lo.batch_size = 3;
  lo.seed = 11;
  DataLoader a(d, lo);
  a.StartEpoch(2);
  Batch b;
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(a.Next(&b));
  const data::Position p = a.position();
  ASSERT_TRUE(a.Next(&b));
  DataLoader c(d, lo);
  c.Seek(p);
  Batch b2;
  ASSERT_TRUE(c.Next(&b2));
  EXPECT_EQ(b.images, b2.images);
  EXPECT_EQ(b.labels, b2.labels);

  // Balanced splits slice each step's global batch: shares of the same T-token windows.
  DataLoaderOptions g;
  g.batch_size = 4;
  g.world_size = 2;
  g.global_slices = true;
  DataLoader s(d, g);
  s.SetShare(0, 6);
  ASSERT_TRUE(s.Next(&b));
  EXPECT_EQ(b.n, 6);
  EXPECT_EQ(b.labels.size(), 24u);
}

// Every window of a batch: where it starts in the file (token k of the test files is k).
std::vector<int64_t> Starts(DataLoader& l, int64_t T) {
  std::vector<int64_t> out;
  Batch b;
  while (l.Next(&b))
    for (int64_t j = 0; j < b.n; ++j) {
      const int64_t s = int64_t(b.images[size_t(j * T)]);
      for (int64_t k = 0; k < T; ++k) {
        EXPECT_EQ(b.images[size_t(j * T + k)], float(s + k));
        EXPECT_EQ(b.labels[size_t(j * T + k)], int32_t(s + k + 1));
      }
      out.push_back(s);
    }
  return out;
}

// Training windows (token_offsets) start at a phase drawn per epoch from the seed: the same
// for the seed on every run and after a seek, different from epoch to epoch, each epoch a
// tiling of disjoint windows split across the workers; test windows stay at i*seq_len.
TEST(TokensReader, TrainingWindowsShiftPerEpochFromTheSeed) {
  TempDir dir;
  const int64_t T = 8, n = 1001;  // 124 shifted windows (one fewer than fixed: room to shift)
  const std::string path = WriteTokens(dir, "train.bin", n, 60000);
  auto d = LoadDataset("tokens", path, Opts(T, 60000));
  ASSERT_EQ(d->size(), 125);
  ASSERT_EQ(d->shifted_windows(), 124);
  ASSERT_EQ(d->token_phase_room(), 8);
  DataLoaderOptions lo;
  lo.batch_size = 5;
  lo.world_size = 2;
  lo.seed = 42;
  lo.token_offsets = true;
  std::set<int64_t> phases;
  for (int64_t e = 0; e < 8; ++e) {
    std::vector<int64_t> all;
    for (int r = 0; r < 2; ++r) {
      DataLoaderOptions o = lo;
      o.rank = r;
      DataLoader l(d, o);
      EXPECT_EQ(l.batches_per_epoch(), 12);  // 124 / 2 = 62 per worker
      l.StartEpoch(e);
      std::vector<int64_t> s = Starts(l, T);
      EXPECT_EQ(s.size(), 60u);
      // The same seed gives the same windows again.
      DataLoader again(d, o);
      again.StartEpoch(e);
      EXPECT_EQ(Starts(again, T), s);
      all.insert(all.end(), s.begin(), s.end());
    }
    // One phase per epoch; the windows of both workers never share a token (the last
    // target of one window is the first input of the next, as in any tiling).
    std::sort(all.begin(), all.end());
    for (size_t k = 0; k < all.size(); ++k) {
      EXPECT_EQ(all[k] % T, all[0] % T);
      if (k > 0) {
        EXPECT_GE(all[k] - all[k - 1], T) << "overlapping windows in epoch " << e;
      }
      EXPECT_LE(all[k] + T, n - 1);  // the last target exists
    }
    phases.insert(all[0] % T);
  }
  EXPECT_GE(phases.size(), 3u) << "the phase is not drawn per epoch";

  // Another seed cuts the text elsewhere.
  std::vector<int64_t> p42, p43;
  for (int64_t e = 0; e < 8; ++e)
    for (auto [seed, out] : {std::make_pair(uint64_t(42), &p42), std::make_pair(uint64_t(43), &p43)}) {
      DataLoaderOptions o = lo;
      o.world_size = 1;
      o.seed = seed;
      DataLoader l(d, o);
      l.StartEpoch(e);
      out->push_back(Starts(l, T)[0] % T);
    }
  EXPECT_NE(p42, p43);

  // Resume: a fresh loader seeked to the position gives the rest of the epoch exactly.
  DataLoader a(d, lo);
  a.StartEpoch(5);
  Batch b;
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(a.Next(&b));
  const data::Position p = a.position();
  std::vector<int64_t> rest = Starts(a, T);
  DataLoader c(d, lo);
  c.Seek(p);
  EXPECT_EQ(Starts(c, T), rest);
  EXPECT_EQ(rest.size(), 8u * 5u);

  // Evaluation windows (no token_offsets): at multiples of seq_len, every window of the file.
  DataLoaderOptions t;
  t.batch_size = 16;
  t.shuffle = false;
  t.drop_last = false;
  DataLoader test(d, t);
  std::vector<int64_t> fixed = Starts(test, T);
  ASSERT_EQ(fixed.size(), 125u);
  for (size_t k = 0; k < fixed.size(); ++k) EXPECT_EQ(fixed[k], int64_t(k) * T);
}

// skip_bad: a window holding an id >= vocab_size (as input or as its last target) is
// replaced by the next clean window, counted each time, and each bad id named once by file
// and byte offset; the same windows for the seed on every run. Without it the file is refused
// at load; a file mostly of bad ids is refused even with it.
TEST(TokensReader, SkipBadReplacesWindowsHoldingBadIds) {
  TempDir dir;
  const int64_t T = 8, n = 1001;
  std::vector<uint8_t> bytes;
  for (int64_t k = 0; k < n; ++k) {
    // Token k is k, but for 5000 (past vocab_size 1001) at tokens 100 and 523.
    const uint16_t t = (k == 100 || k == 523) ? 5000 : uint16_t(k);
    bytes.push_back(uint8_t(t & 0xff));
    bytes.push_back(uint8_t(t >> 8));
  }
  const std::string path = dir / "bad.bin";
  testdata::WriteBytes(path, bytes);
  std::string e = ErrorOf(path, Opts(T, 1001));
  EXPECT_NE(e.find(path + ": token 5000 at byte offset 200 (token 100)"), std::string::npos) << e;
  EXPECT_NE(e.find("skip_bad"), std::string::npos) << e;

  DatasetOptions o = Opts(T, 1001);
  o.skip_bad = true;
  auto d = LoadDataset("tokens", path, o);
  EXPECT_EQ(d->bad_tokens(), 2);
  DataLoaderOptions lo;
  lo.batch_size = 4;
  lo.seed = 5;
  lo.skip_bad = true;
  lo.token_offsets = true;
  for (int64_t e = 0; e < 3; ++e) {
    std::vector<std::vector<int64_t>> runs;
    std::vector<int64_t> skips;
    std::vector<std::vector<std::string>> notes;
    for (int run = 0; run < 2; ++run) {
      DataLoader l(d, lo);
      l.StartEpoch(e);
      // Starts() checks every window's ids and labels are the file's clean k, k+1, ...
      std::vector<int64_t> s = Starts(l, T);
      EXPECT_EQ(s.size(), size_t(l.batches_per_epoch() * 4));
      for (int64_t st : s) {
        EXPECT_FALSE(st <= 100 && 100 <= st + T) << st;
        EXPECT_FALSE(st <= 523 && 523 <= st + T) << st;
      }
      runs.push_back(s);
      skips.push_back(l.skipped());
      notes.push_back(l.TakeSkipNotes());
    }
    EXPECT_EQ(runs[0], runs[1]);
    EXPECT_EQ(skips[0], skips[1]);
    // Each bad id lies in one window of the tiling (two when it is a window's last target,
    // which is the next one's first input); 124 shifted windows, 31 batches of 4 use all of them.
    EXPECT_GE(skips[0], 2);
    EXPECT_LE(skips[0], 4);
    ASSERT_EQ(notes[0].size(), 2u);
    std::sort(notes[0].begin(), notes[0].end());
    EXPECT_EQ(notes[0][0], path +
                               ": token 5000 at byte offset 1046 is not below [data] vocab_size = 1001: the "
                               "windows holding it are skipped");
    EXPECT_NE(notes[0][1].find(path + ": token 5000 at byte offset 200 "), std::string::npos) << notes[0][1];
  }

  // Mostly bad ids: a wrong vocab_size, refused even with skip_bad.
  e = ErrorOf(WriteTokens(dir, "wide.bin", 1000), [] {
    DatasetOptions w = Opts(8, 300);
    w.skip_bad = true;
    return w;
  }());
  EXPECT_NE(e.find("is [data] vocab_size right?"), std::string::npos) << e;
}

TEST(TokensReader, BadFilesNameTheFile) {
  TempDir dir;
  testdata::WriteBytes(dir / "odd.bin", std::vector<uint8_t>(21, 1));
  std::string e = ErrorOf(dir / "odd.bin", Opts(4, 300));
  EXPECT_NE(e.find(dir / "odd.bin"), std::string::npos) << e;
  EXPECT_NE(e.find("odd length"), std::string::npos) << e;

  e = ErrorOf(WriteTokens(dir, "short.bin", 8), Opts(8, 300));
  EXPECT_NE(e.find(dir / "short.bin"), std::string::npos) << e;
  EXPECT_NE(e.find("8 tokens, fewer than seq_len + 1 = 9"), std::string::npos) << e;

  e = ErrorOf(WriteTokens(dir, "empty.bin", 0), Opts(8, 300));
  EXPECT_NE(e.find(dir / "empty.bin"), std::string::npos) << e;
  EXPECT_NE(e.find("empty (0 bytes, 0 tokens)"), std::string::npos) << e;

  // Token 300 is the 301st: byte offset 600.
  e = ErrorOf(WriteTokens(dir, "big.bin", 1000), Opts(8, 300));
  EXPECT_NE(e.find(dir / "big.bin"), std::string::npos) << e;
  EXPECT_NE(e.find("token 300 at byte offset 600"), std::string::npos) << e;
  EXPECT_NE(e.find("vocab_size = 300"), std::string::npos) << e;

  // A bad id far into a large file (past the scan's first chunks) is still named by its offset.
  {
    std::vector<uint8_t> bytes(2 * 300000, 0);
    bytes[2 * 250001] = 0x2c;  // 300 = 0x012c
    bytes[2 * 250001 + 1] = 0x01;
    testdata::WriteBytes(dir / "late.bin", bytes);
  }
  e = ErrorOf(dir / "late.bin", Opts(8, 300));
  EXPECT_NE(e.find(dir / "late.bin: token 300 at byte offset 500002 (token 250001)"), std::string::npos) << e;

  e = ErrorOf(dir / "missing.bin", Opts(8, 300));
  EXPECT_NE(e.find(dir / "missing.bin"), std::string::npos) << e;
  e = ErrorOf(dir.path(), Opts(8, 300));
  EXPECT_NE(e.find("not a regular file"), std::string::npos) << e;

  // A test set must match the training set's windows.
  auto train = LoadDataset("tokens", WriteTokens(dir, "a.bin", 100), Opts(8, 1000));
  auto test = LoadDataset("tokens", WriteTokens(dir, "b.bin", 100), Opts(4, 1000));
  EXPECT_THROW(test->UseNormalizationOf(*train), Error);
  auto ok = LoadDataset("tokens", WriteTokens(dir, "c.bin", 100), Opts(8, 1000));
  ok->UseNormalizationOf(*train);
  EXPECT_EQ(ok->num_classes(), 1000);
}

}  // namespace
}  // namespace shoal
