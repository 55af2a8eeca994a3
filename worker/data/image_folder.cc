#include "worker/data/image_folder.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <set>

#include "common/error.h"
#include "worker/data/file_util.h"

namespace shoal {
namespace data {

namespace {

// Entries of `dir`, sorted, without "." and "..".
std::vector<std::string> List(const std::string& dir) {
  DIR* d = opendir(dir.c_str());
  if (!d) throw InputError(dir + ": cannot list folder: " + strerror(errno));
  std::vector<std::string> names;
  while (dirent* e = readdir(d)) {
    std::string n = e->d_name;
    if (n != "." && n != "..") names.push_back(n);
  }
  closedir(d);
  std::sort(names.begin(), names.end());
  return names;
}

bool IsImageName(const std::string& name) {
  const size_t dot = name.rfind('.');
  if (dot == std::string::npos) return false;
  std::string ext = name.substr(dot + 1);
  for (char& c : ext) c = char(tolower(static_cast<unsigned char>(c)));
  return ext == "jpg" || ext == "jpeg" || ext == "png";
}

// Every image below `dir`, in sorted path order (os.walk's order in torchvision: files of
// a folder before its sub-folders' is not guaranteed there, so sorted paths it is here).
void Walk(const std::string& dir, int depth, std::vector<std::string>* images, int64_t* others,
          std::string* first_other) {
  if (depth > 32) throw InputError(dir + ": folders nested more than 32 deep (a link loop?)");
  for (const std::string& n : List(dir)) {
    const std::string p = dir + "/" + n;
    if (DirExists(p)) {
      Walk(p, depth + 1, images, others, first_other);
    } else if (IsImageName(n) && FileExists(p)) {
      images->push_back(p);
    } else {
      if (first_other->empty()) *first_other = p;
      ++*others;
    }
  }
}

class ImageFiles : public EncodedImages {
 public:
  explicit ImageFiles(std::vector<std::string> files) : files_(std::move(files)) {}
  void Read(int64_t i, std::vector<uint8_t>* out) const override { ReadRawFile(files_[size_t(i)], out); }
  std::string Name(int64_t i) const override { return files_[size_t(i)]; }

 private:
  std::vector<std::string> files_;
};

std::string Join(const std::vector<std::string>& v, size_t max = 8) {
  std::string s;
  for (size_t i = 0; i < v.size() && i < max; ++i) s += (i ? ", " : "") + v[i];
  if (v.size() > max) s += ", ... (" + std::to_string(v.size()) + " in all)";
  return s;
}

}  // namespace

void ReadRawFile(const std::string& path, std::vector<uint8_t>* out) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    if (err == EIO) throw TransientError(path + ": cannot open: " + strerror(err));
    throw InputError(path + ": cannot open: " + strerror(err));
  }
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    throw InputError(path + ": not a regular file");
  }
  if (st.st_size > kMaxInflatedBytes) {
    close(fd);
    throw InputError(path + ": " + std::to_string(st.st_size) + " bytes is too large for an image");
  }
  out->resize(size_t(st.st_size));
  size_t got = 0;
  while (got < out->size()) {
    ssize_t r = read(fd, out->data() + got, out->size() - got);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      const int err = errno;
      close(fd);
      throw TransientError(path + ": read error: " + strerror(err));
    }
    if (r == 0) break;  // shrank while reading: decode what there is, which names the file if it is cut
    got += size_t(r);
  }
  close(fd);
  out->resize(got);
}

std::vector<int64_t> SpreadSubset(int64_t n, int64_t max_samples) {
  std::vector<int64_t> keep;
  if (max_samples <= 0 || max_samples >= n) return keep;
  keep.reserve(size_t(max_samples));
  for (int64_t k = 0; k < max_samples; ++k) keep.push_back(int64_t((__int128)k * n / max_samples));
  return keep;
}

std::vector<int64_t> EncodedSampleShape(const std::string& source, const DatasetOptions& o) {
  if (o.channels != 1 && o.channels != 3)
    throw InputError(source + ": [data] channels: expected 1 or 3, got " + std::to_string(o.channels));
  if (o.image_size < 1 || o.image_size > 4096)
    throw InputError(source + ": [data] image_size: expected 1..4096, got " + std::to_string(o.image_size));
  return {o.channels, o.image_size, o.image_size};
}

void EncodedNormalization(const std::string& source, const DatasetOptions& o, std::vector<float>* mean,
                          std::vector<float>* stddev) {
  const size_t C = size_t(o.channels);
  if (!o.mean.empty() && o.mean.size() != C)
    throw InputError(source + ": [data] mean: " + std::to_string(o.mean.size()) + " values for " + std::to_string(C) +
                     " channels");
  if (!o.stddev.empty() && o.stddev.size() != C)
    throw InputError(source + ": [data] std: " + std::to_string(o.stddev.size()) + " values for " + std::to_string(C) +
                     " channels");
  if (C == 3) {
    *mean = {kImageNetMean[0], kImageNetMean[1], kImageNetMean[2]};
    *stddev = {kImageNetStd[0], kImageNetStd[1], kImageNetStd[2]};
  } else {
    *mean = {kImageNetLumaMean};
    *stddev = {kImageNetLumaStd};
  }
  if (!o.mean.empty()) *mean = o.mean;
  if (!o.stddev.empty()) *stddev = o.stddev;
}

std::shared_ptr<Dataset> ReadImageFolder(const std::string& path, const DatasetOptions& o) {
  if (!DirExists(path)) throw InputError(path + ": not a folder (imagefolder wants <dir>/<class>/<image>)");
  const std::vector<int64_t> shape = EncodedSampleShape(path, o);
  std::vector<float> mean, stddev;
  EncodedNormalization(path, o, &mean, &stddev);

  std::vector<std::string> found;
  for (const std::string& n : List(path))
    if (DirExists(path + "/" + n)) found.push_back(n);
  int64_t skipped = 0;
  auto skip = [&](const std::string& why) {
    if (!o.skip_bad) throw InputError(why);
    fprintf(stderr, "shoal: skipping bad data ([data] skip_bad): %s\n", why.c_str());
    ++skipped;
  };

  // A test set is labelled by the training set's classes; any difference is named.
  std::vector<std::string> classes = o.classes.empty() ? found : o.classes;
  if (!o.classes.empty()) {
    std::set<std::string> have(found.begin(), found.end()), want(o.classes.begin(), o.classes.end());
    std::vector<std::string> lacks, adds;
    for (const std::string& c : o.classes)
      if (!have.count(c)) lacks.push_back(c);
    for (const std::string& c : found)
      if (!want.count(c)) adds.push_back(c);
    for (const std::string& c : lacks)
      skip(path + ": lacks class \"" + c + "\" of the training set (its classes: " + Join(o.classes) + ")");
    for (const std::string& c : adds)
      skip(path + "/" + c + ": class \"" + c + "\" is not one of the training set's (" + Join(o.classes) + ")");
  }
  if (classes.empty()) throw InputError(path + ": no class folders (imagefolder wants <dir>/<class>/<image>)");
  if (o.num_classes > 0 && int64_t(classes.size()) > o.num_classes)
    throw InputError(path + ": " + std::to_string(classes.size()) +
                     " class folders but [data] classes = " + std::to_string(o.num_classes));

  std::vector<std::string> files;
  std::vector<int32_t> labels;
  int64_t others = 0;
  std::string first_other;
  for (size_t k = 0; k < classes.size(); ++k) {
    const std::string dir = path + "/" + classes[k];
    if (!DirExists(dir)) continue;  // a class this test set lacks: reported above
    const size_t before = files.size();
    Walk(dir, 0, &files, &others, &first_other);
    if (files.size() == before) skip(dir + ": empty class folder (no .jpg, .jpeg or .png file)");
    labels.resize(files.size(), int32_t(k));
  }
  if (others > 0)
    fprintf(stderr, "shoal: %s: left out %lld file(s) that are not .jpg, .jpeg or .png (the first: %s)\n", path.c_str(),
            (long long)others, first_other.c_str());
  if (files.empty()) throw InputError(path + ": no images (.jpg, .jpeg or .png) in any class folder");

  const std::vector<int64_t> keep = SpreadSubset(int64_t(files.size()), o.max_samples);
  if (!keep.empty()) {
    std::vector<std::string> f;
    std::vector<int32_t> l;
    for (int64_t i : keep) {
      f.push_back(files[size_t(i)]);
      l.push_back(labels[size_t(i)]);
    }
    files.swap(f);
    labels.swap(l);
  }
  const int64_t num_classes = o.num_classes > 0 ? o.num_classes : int64_t(classes.size());
  return Dataset::FromEncoded(path, shape, std::move(labels), num_classes,
                              std::make_shared<ImageFiles>(std::move(files)), std::move(mean), std::move(stddev),
                              skipped, classes);
}

}  // namespace data
}  // namespace shoal
