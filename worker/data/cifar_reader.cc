#include "worker/data/cifar_reader.h"

#include "common/error.h"
#include "worker/data/file_util.h"

namespace shoal {
namespace data {

namespace {

std::string Dirname(const std::string& p) {
  size_t at = p.find_last_of('/');
  return at == std::string::npos ? "." : (at == 0 ? "/" : p.substr(0, at));
}

std::string Basename(const std::string& p) {
  size_t at = p.find_last_of('/');
  return at == std::string::npos ? p : p.substr(at + 1);
}

// <prefix>_1.bin, <prefix>_2.bin, ... up to the first gap.
std::vector<std::string> Numbered(const std::string& prefix) {
  std::vector<std::string> out;
  for (int i = 1;; ++i) {
    std::string f = prefix + "_" + std::to_string(i) + ".bin";
    if (!FileExists(f)) break;
    out.push_back(f);
  }
  return out;
}

// What tells the two layouts apart; everything else is shared.
struct Layout {
  const char* name;       // for messages
  int64_t record_bytes;   // label bytes + kCifarPixelBytes
  int label_at;           // which label byte is the label
  int64_t classes;        // the default class count
  const char* train;      // the training set in a directory: numbered batches or one file
  bool train_numbered;
  const char* test;       // the test file's name without .bin
  const char* other_hint; // what to say when the records look like the other layout
};

const Layout kCifar10 = {"CIFAR-10", kCifarRecordBytes, 0, 10, "data_batch", true, "test_batch",
                         "is this CIFAR-100? use [data] format = \"cifar100\""};
const Layout kCifar100Fine = {"CIFAR-100", kCifar100RecordBytes, 1, 100, "train", false, "test",
                              "is this CIFAR-10? use [data] format = \"cifar\""};
const Layout kCifar100Coarse = {"CIFAR-100", kCifar100RecordBytes, 0, 20, "train", false, "test",
                                "is this CIFAR-10? use [data] format = \"cifar\""};

// The training files under `dir`, or none.
std::vector<std::string> TrainFiles(const Layout& l, const std::string& dir) {
  const std::string p = dir + "/" + l.train;
  if (l.train_numbered) return Numbered(p);
  if (FileExists(p + ".bin")) return {p + ".bin"};
  return {};
}

std::vector<std::string> ResolveFiles(const Layout& l, const std::string& path) {
  if (FileExists(path)) return {path};
  const std::string train_first = std::string(l.train) + (l.train_numbered ? "_1.bin" : ".bin");
  std::string tried;
  if (DirExists(path)) {
    std::vector<std::string> f = TrainFiles(l, path);
    if (!f.empty()) return f;
    throw Error(path + ": directory holds no " + l.name + " training " + (l.train_numbered ? "batches" : "file") +
                " (expected " + train_first + (l.train_numbered ? " ..." : "") + "; for the test set name " + path +
                "/" + l.test + ".bin)");
  }
  if (FileExists(path + ".bin")) return {path + ".bin"};
  std::vector<std::string> f = Numbered(path);
  if (!f.empty()) return f;
  tried = path + ", " + path + ".bin, " + path + "_1.bin";
  const std::string dir = Dirname(path), base = Basename(path);
  if (base == "train") {
    f = TrainFiles(l, dir);
    if (!f.empty()) return f;
    tried += ", " + dir + "/" + train_first;
  } else if (base == "test") {
    const std::string t = dir + "/" + l.test + ".bin";
    if (FileExists(t)) return {t};
    tried += ", " + t;
  }
  throw Error(path + ": no " + l.name + " binary file found (tried " + tried + ")");
}

std::shared_ptr<Dataset> ReadRecords(const Layout& l, const std::string& path, const DatasetOptions& options) {
  const std::string fmt = l.record_bytes == kCifarRecordBytes ? "cifar" : "cifar100";
  SHOAL_CHECK(!path.empty(), "[data] " + fmt + ": empty path (expected a .bin file, a directory or a prefix)");
  const int64_t classes = options.num_classes > 0 ? options.num_classes : l.classes;
  const int64_t rb = l.record_bytes, label_bytes = rb - kCifarPixelBytes;
  std::vector<uint8_t> pixels;
  std::vector<int32_t> labels;
  const std::vector<std::string> files = ResolveFiles(l, path);
  for (const std::string& file : files) {
    if (options.max_samples > 0 && int64_t(labels.size()) >= options.max_samples) break;
    std::vector<uint8_t> b = ReadFileBytes(file);
    const int64_t size = int64_t(b.size());
    if (size == 0)
      throw Error(file + ": empty file, expected " + l.name + " records of " + std::to_string(rb) + " bytes");
    if (size % rb != 0) {
      const int64_t other = rb == kCifarRecordBytes ? kCifar100RecordBytes : kCifarRecordBytes;
      throw Error(file + ": truncated or not " + l.name + " binary: expected a multiple of " + std::to_string(rb) +
                  " bytes (" + std::to_string((size / rb + 1) * rb) + " for " + std::to_string(size / rb + 1) +
                  " records), got " + std::to_string(size) +
                  (size % other == 0 ? std::string(" (whole records of ") + std::to_string(other) + " bytes: " +
                                           l.other_hint + ")"
                                     : ""));
    }
    int64_t records = size / rb;
    if (options.max_samples > 0) records = std::min(records, options.max_samples - int64_t(labels.size()));
    pixels.reserve(pixels.size() + size_t(records * kCifarPixelBytes));
    for (int64_t r = 0; r < records; ++r) {
      const uint8_t* rec = b.data() + r * rb;
      const uint8_t label = rec[l.label_at];
      if (label >= classes)
        throw Error(file + ": " + (label_bytes == 1 ? "label " : (l.label_at ? "fine label " : "coarse label ")) +
                    std::to_string(label) + " of record " + std::to_string(r) + " is outside 0.." +
                    std::to_string(classes - 1) + (label_bytes == 1 ? " (" + std::string(l.other_hint) + ")" : ""));
      labels.push_back(label);
      pixels.insert(pixels.end(), rec + label_bytes, rec + rb);
    }
  }
  std::string source = files.size() == 1 ? files[0] : files[0] + " (+" + std::to_string(files.size() - 1) + " more)";
  return Dataset::FromU8(source, {3, 32, 32}, std::move(pixels), std::move(labels), classes);
}

}  // namespace

std::shared_ptr<Dataset> ReadCifar(const std::string& path, const DatasetOptions& options) {
  return ReadRecords(kCifar10, path, options);
}

std::shared_ptr<Dataset> ReadCifar100(const std::string& path, const DatasetOptions& options) {
  return ReadRecords(options.cifar100_coarse ? kCifar100Coarse : kCifar100Fine, path, options);
}

}  // namespace data
}  // namespace shoal
