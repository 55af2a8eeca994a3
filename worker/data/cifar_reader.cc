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

std::vector<std::string> ResolveFiles(const std::string& path) {
  if (FileExists(path)) return {path};
  std::string tried;
  if (DirExists(path)) {
    std::vector<std::string> f = Numbered(path + "/data_batch");
    if (!f.empty()) return f;
    throw Error(path +
                ": directory holds no CIFAR training batches (expected data_batch_1.bin ...; for the test set "
                "name " +
                path + "/test_batch.bin)");
  }
  if (FileExists(path + ".bin")) return {path + ".bin"};
  std::vector<std::string> f = Numbered(path);
  if (!f.empty()) return f;
  tried = path + ", " + path + ".bin, " + path + "_1.bin";
  const std::string dir = Dirname(path), base = Basename(path);
  if (base == "train") {
    f = Numbered(dir + "/data_batch");
    if (!f.empty()) return f;
    tried += ", " + dir + "/data_batch_1.bin";
  } else if (base == "test") {
    if (FileExists(dir + "/test_batch.bin")) return {dir + "/test_batch.bin"};
    tried += ", " + dir + "/test_batch.bin";
  }
  throw Error(path + ": no CIFAR binary file found (tried " + tried + ")");
}

}  // namespace

std::shared_ptr<Dataset> ReadCifar(const std::string& path, const DatasetOptions& options) {
  SHOAL_CHECK(!path.empty(), "[data] cifar: empty path (expected a .bin file, a directory or a prefix)");
  const int64_t classes = options.num_classes > 0 ? options.num_classes : 10;
  const int64_t pixels_per = kCifarRecordBytes - 1;
  std::vector<uint8_t> pixels;
  std::vector<int32_t> labels;
  const std::vector<std::string> files = ResolveFiles(path);
  for (const std::string& file : files) {
    if (options.max_samples > 0 && int64_t(labels.size()) >= options.max_samples) break;
    std::vector<uint8_t> b = ReadFileBytes(file);
    const int64_t size = int64_t(b.size());
    if (size == 0)
      throw Error(file + ": empty file, expected CIFAR records of " + std::to_string(kCifarRecordBytes) + " bytes");
    if (size % kCifarRecordBytes != 0)
      throw Error(file + ": truncated or not CIFAR-10 binary: expected a multiple of " +
                  std::to_string(kCifarRecordBytes) + " bytes (" +
                  std::to_string((size / kCifarRecordBytes + 1) * kCifarRecordBytes) + " for " +
                  std::to_string(size / kCifarRecordBytes + 1) + " records), got " + std::to_string(size));
    int64_t records = size / kCifarRecordBytes;
    if (options.max_samples > 0) records = std::min(records, options.max_samples - int64_t(labels.size()));
    pixels.reserve(pixels.size() + size_t(records * pixels_per));
    for (int64_t r = 0; r < records; ++r) {
      const uint8_t* rec = b.data() + r * kCifarRecordBytes;
      if (rec[0] >= classes)
        throw Error(file + ": label " + std::to_string(rec[0]) + " of record " + std::to_string(r) + " is outside 0.." +
                    std::to_string(classes - 1) + " (is this CIFAR-100? only CIFAR-10 binary is supported)");
      labels.push_back(rec[0]);
      pixels.insert(pixels.end(), rec + 1, rec + kCifarRecordBytes);
    }
  }
  std::string source = files.size() == 1 ? files[0] : files[0] + " (+" + std::to_string(files.size() - 1) + " more)";
  return Dataset::FromU8(source, {3, 32, 32}, std::move(pixels), std::move(labels), classes);
}

}  // namespace data
}  // namespace shoal
