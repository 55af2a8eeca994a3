// One shard's key-value store: whole tensors by name. Stored buffers are shared, so a pull
// reply hands ZeroMQ a reference instead of a copy; a write to a buffer still being sent
// copies it first (copy-on-write).
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/dtype.h"
#include "common/training_plan.h"
#include "common/messages/schema.capnp.h"
#include "common/transport/transport.h"

namespace shoal {

struct Buffer {
  Frame bytes;  // a received frame kept as-is (any alignment), or a fresh allocation
  char* data() { return static_cast<char*>(bytes.data()); }
  size_t size() const { return bytes.size(); }
};

struct StoredTensor {
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  std::shared_ptr<Buffer> buf;
  uint64_t version = 0;              // pushes applied
  std::shared_ptr<void> rule_state;  // the UpdateRule's per-tensor state (e.g. momentum)
  size_t elements() const { return buf->size() / DTypeSize(dtype); }
};

// What a push with op = apply does to a stored tensor: the hook for server-side optimizers
// (SGD, LARS, LAMB... live in algorithms/ and plug in here). `param` is writable and not
// shared with any pending send.
class UpdateRule {
 public:
  virtual ~UpdateRule() = default;
  virtual void Apply(const std::string& name, StoredTensor& param, const void* grad, size_t bytes) = 0;
  // The workers' training plan (schedule, which pushes make a step); throws shoal::Error
  // for one the rule cannot follow.
  virtual void SetPlan(const TrainingPlan& plan) { (void)plan; }
  // The per-tensor state as bytes for a checkpoint, and back (the rule checks what it reads).
  virtual std::string SaveState(const StoredTensor& t) const {
    (void)t;
    return {};
  }
  virtual void LoadState(StoredTensor& t, std::string_view bytes) const {
    (void)t;
    (void)bytes;
  }
  // The tensor's state as if `step` global steps of the plan (SetPlan's) were done: a
  // checkpoint of another number of workers counted its steps in another global batch.
  virtual void Restep(StoredTensor& t, int64_t step) const {
    (void)t;
    (void)step;
  }
};

// Default rule: accumulate (param += grad).
class AddRule : public UpdateRule {
 public:
  void Apply(const std::string& name, StoredTensor& param, const void* grad, size_t bytes) override;
};

// Elementwise dst += src for n elements of type t (fp16/bf16 summed in fp32).
void AddInto(DType t, void* dst, const void* src, size_t n);

class KvShard {
 public:
  KvShard() : rule_(std::make_unique<AddRule>()) {}
  void SetUpdateRule(std::unique_ptr<UpdateRule> rule) { rule_ = std::move(rule); }

  // Applies one pushed tensor; `data` is the received frame, at any alignment (kept without
  // copying on assign; copied to alignment only when an update reads it as floats). Throws
  // shoal::Error if dtype/shape disagree with the stored tensor. Returns the bytes an assign
  // replaced, so the caller can free them after answering (freeing a large buffer costs
  // page-table work that need not delay the reply); empty when a pending send still holds
  // them (ZeroMQ frees them once sent). The stored tensor is `*stored` when given.
  Frame Push(const std::string& name, DType dtype, const std::vector<int64_t>& shape, Frame&& data, msg::PushOp op,
             const StoredTensor** stored = nullptr);
  // nullptr when absent.
  const StoredTensor* Find(const std::string& name) const;
  size_t size() const { return tensors_.size(); }
  const std::map<std::string, StoredTensor>& tensors() const { return tensors_; }
  const UpdateRule& rule() const { return *rule_; }
  void SetPlan(const TrainingPlan& plan) { rule_->SetPlan(plan); }
  // Replaces everything held with `tensors` (a checkpoint being restored).
  void ReplaceAll(std::map<std::string, StoredTensor> tensors) { tensors_ = std::move(tensors); }
  void Erase(const std::string& name) { tensors_.erase(name); }
  // UpdateRule::Restep on every tensor but the control values ("__shoal/...").
  void Restep(int64_t step);
  uint64_t bytes() const;

 private:
  StoredTensor& Writable(const std::string& name);
  std::map<std::string, StoredTensor> tensors_;
  std::unique_ptr<UpdateRule> rule_;
};

}  // namespace shoal
