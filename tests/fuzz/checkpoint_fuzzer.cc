// Fuzzes loading a shard's checkpoint: the input is the shard's whole RocksDB content
// (key/value pairs, so stored records and the keys naming them are both fuzzed), written
// into a fresh database that the real Checkpointer then opens and reads: Committed,
// Written, Load of every id it finds. What Load accepts must then be usable, so every
// loaded tensor is checked for a size that matches its shape and gets one APPLY push
// through the job's server optimizer (LAMB, with its restored state). Input:
//   repeat { u16 key_len, key, u32 value_len, value }
// SHOAL_CHECKPOINT_SEED_OUT=FILE makes the binary write a seed from a real checkpoint
// (Checkpointer::Write of two tensors after one update each) to FILE and exit.
#include <glog/logging.h>
#include <rocksdb/db.h>
#include <rocksdb/write_batch.h>
#include <sys/stat.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "common/config.h"
#include "common/error.h"
#include "server/aggregation.h"
#include "server/checkpointer.h"
#include "server/kv_shard.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

const char kJob[] = R"(
[job]
name = "fuzz"
[cluster]
servers = ["127.0.0.1:7701"]
workers = 2
[data]
format = "synthetic"
[optimizer]
name = "lamb"
lr = 0.1
weight_decay = 1e-4
)";

const shoal::JobConfig& Job() {
  static const shoal::JobConfig cfg = shoal::ParseJobConfig(kJob, "fuzz.toml");
  return cfg;
}

std::unique_ptr<shoal::KvShard> NewShard() {
  auto kv = std::make_unique<shoal::KvShard>();
  kv->SetUpdateRule(shoal::MakeServerUpdateRule(Job()));
  shoal::TrainingPlan plan;
  plan.steps_per_epoch = 10;
  plan.total_steps = 100;
  plan.rule = shoal::msg::ServerRule::APPLY_EACH;
  plan.workers = 2;
  plan.global_batch = 64;
  kv->SetPlan(plan);
  return kv;
}

shoal::Frame Floats(size_t n, float v) {
  std::vector<float> f(n, v);
  return shoal::Frame(f.data(), n * sizeof(float));
}

void Put(std::string* out, const std::string& k, const std::string& v) {
  uint16_t kl = uint16_t(k.size());
  uint32_t vl = uint32_t(v.size());
  out->append(reinterpret_cast<const char*>(&kl), 2).append(k);
  out->append(reinterpret_cast<const char*>(&vl), 4).append(v);
}

void WriteSeed(const char* file) {
  const std::string dir = shoal::fuzz::ScratchDir() + "/seed";
  {
    shoal::Checkpointer ck(dir, 0, shoal::CheckpointStart::kFresh);
    auto kv = NewShard();
    kv->Push("fc.weight", shoal::DType::kF32, {2, 3}, Floats(6, 0.5f), shoal::msg::PushOp::ASSIGN);
    kv->Push("fc.bias", shoal::DType::kF32, {3}, Floats(3, 0.f), shoal::msg::PushOp::ASSIGN);
    kv->Push("fc.weight", shoal::DType::kF32, {2, 3}, Floats(6, 0.1f), shoal::msg::PushOp::APPLY);
    kv->Push("fc.bias", shoal::DType::kF32, {3}, Floats(3, 0.1f), shoal::msg::PushOp::APPLY);
    shoal::CheckpointRecord rec;
    rec.id = 1;
    rec.step = 1;
    rec.batch = 1;
    rec.shards = 1;
    ck.Write(rec, /*keep=*/0, *kv);
    ck.Commit(rec);
  }
  rocksdb::DB* db = nullptr;
  if (!rocksdb::DB::Open(rocksdb::Options(), dir + "/shard-0", &db).ok()) abort();
  std::unique_ptr<rocksdb::DB> owned(db);
  std::string out;
  std::unique_ptr<rocksdb::Iterator> it(db->NewIterator(rocksdb::ReadOptions()));
  for (it->SeekToFirst(); it->Valid(); it->Next()) Put(&out, it->key().ToString(), it->value().ToString());
  shoal::fuzz::WriteFile(file, reinterpret_cast<const uint8_t*>(out.data()), out.size());
}

// A loaded tensor whose bytes disagree with its shape would be served to workers as is.
void CheckLoaded(const shoal::KvShard& kv) {
  for (auto& [name, t] : kv.tensors()) {
    unsigned __int128 elems = 1;
    for (int64_t d : t.shape) {
      if (d < 0) abort();
      elems *= uint64_t(d);
      if (elems > (unsigned __int128)(1) << 64) abort();
    }
    if (elems * shoal::DTypeSize(t.dtype) != t.buf->size()) {
      fprintf(stderr, "checkpoint_fuzzer: loaded tensor '%s' has %zu bytes for its shape\n", name.c_str(),
              t.buf->size());
      abort();
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  FLAGS_minloglevel = 3;
  google::InitGoogleLogging("checkpoint_fuzzer");
  if (const char* seed = getenv("SHOAL_CHECKPOINT_SEED_OUT")) {
    WriteSeed(seed);
    exit(0);
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string dir = shoal::fuzz::ScratchDir() + "/ckpt";
  const std::string path = dir + "/shard-0";
  {
    rocksdb::Options o;
    o.create_if_missing = true;
    mkdir(dir.c_str(), 0755);  // RocksDB creates only the last folder
    rocksdb::DestroyDB(path, o);
    rocksdb::DB* db = nullptr;
    if (!rocksdb::DB::Open(o, path, &db).ok()) abort();
    std::unique_ptr<rocksdb::DB> owned(db);
    rocksdb::WriteBatch batch;
    shoal::fuzz::Reader in{data, size};
    while (in.n > 0) {
      size_t kl = in.U16();
      std::string key(reinterpret_cast<const char*>(in.p), in.Take(kl));
      size_t vl = in.U32();
      std::string value(reinterpret_cast<const char*>(in.p), in.Take(vl));
      batch.Put(key, value);
    }
    if (!db->Write(rocksdb::WriteOptions(), &batch).ok()) abort();
  }
  try {
    shoal::Checkpointer ck(dir, 0, shoal::CheckpointStart::kResume);
    std::set<uint64_t> ids = {1};
    try {
      ids.insert(ck.Committed().id);
    } catch (const shoal::Error&) {
    }
    for (uint64_t id : ck.Written()) ids.insert(id);
    for (uint64_t id : ids) {
      auto kv = NewShard();
      try {
        ck.Load(id, kv.get());
      } catch (const shoal::Error&) {
        continue;
      }
      CheckLoaded(*kv);
      std::vector<std::string> names;
      for (auto& [name, t] : kv->tensors()) names.push_back(name);
      for (auto& name : names) {
        const shoal::StoredTensor* t = kv->Find(name);
        if (t->buf->size() > (size_t(1) << 20)) continue;
        shoal::Frame grad(t->buf->size());
        memset(grad.data(), 0, grad.size());
        try {
          kv->Push(name, t->dtype, t->shape, std::move(grad), shoal::msg::PushOp::APPLY);
        } catch (const shoal::Error&) {
        }
      }
    }
  } catch (const shoal::Error&) {
  }
  return 0;
}
