#include "worker/engine/cuda/cuda_backend.h"

#include <climits>
#include <cmath>
#include <vector>

#include "common/cuda/platform.h"
#include "common/error.h"
#include "worker/engine/cuda/blas.h"
#include "worker/engine/cuda/kernels.h"

namespace shoal {

using cudautil::Check;
using cudautil::ElemType;

namespace {

std::string Dims(const Shape& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? "," : "") + std::to_string(s[i]);
  return r + "]";
}

int AsInt(int64_t v, const std::string& what) {
  SHOAL_CHECK(v >= 0 && v <= INT_MAX, what + " = " + std::to_string(v) + " does not fit the CUDA libraries' int");
  return int(v);
}

size_t Align256(size_t b) { return (b + 255) / 256 * 256; }

}  // namespace

CudaBackend::CudaBackend(int index, Options options)
    : index_(index), options_(options), alloc_(std::make_shared<CudaAllocator>(index, memory_counter())) {
  const std::string where = "cuda:" + std::to_string(index);
  Check(cudaSetDevice(index), where + " cudaSetDevice");
  cudaDeviceProp prop{};
  Check(cudaGetDeviceProperties(&prop, index), where + " cudaGetDeviceProperties");
  name_ = where + "/" + prop.name;
  try {
    Check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), where + " cudaStreamCreate");
    Check(cudnnCreate(&cudnn_), where + " cudnnCreate");
    Check(cudnnSetStream(cudnn_, stream_), where + " cudnnSetStream");
    cudautil::CheckBlas(blas::Create(&cublas_, stream_, options_.allow_tf32), where + " cublasCreate");
  } catch (...) {
    blas::Destroy(cublas_);
    if (cudnn_) cudnnDestroy(cudnn_);
    if (stream_) cudaStreamDestroy(stream_);
    throw;
  }
}

CudaBackend::~CudaBackend() {
  cudaSetDevice(index_);
  cudaStreamSynchronize(stream_);
  plans_.clear();
  descs_.clear();
  scratch_.reset();
  workspace_.reset();
  blas::Destroy(cublas_);
  cudnnDestroy(cudnn_);
  cudaStreamDestroy(stream_);
}

void CudaBackend::Activate() const { Check(cudaSetDevice(index_), Where("cudaSetDevice")); }

std::string CudaBackend::Where(const char* op) const { return "cuda:" + std::to_string(index_) + " " + op; }

void CudaBackend::Expect(const Tensor& t, const char* op, const char* name, DType dt) const {
  SHOAL_CHECK(t.defined(), Where(op) + ": tensor '" + name + "' is undefined");
  SHOAL_CHECK(t.device() == device(), Where(op) + ": tensor '" + name + "' lives on " + t.device().ToString() +
                                          ", not on this backend's device");
  SHOAL_CHECK(t.dtype() == dt,
              Where(op) + ": tensor '" + name + "' is " + DTypeName(t.dtype()) + ", expected " + DTypeName(dt));
}

void CudaBackend::ExpectShape(const Tensor& t, const Shape& s, const char* op, const char* name) const {
  SHOAL_CHECK(t.shape() == s,
              Where(op) + ": tensor '" + name + "' has shape " + Dims(t.shape()) + ", expected " + Dims(s));
}

cudnnTensorDescriptor_t CudaBackend::Desc4d(int64_t n, int64_t c, int64_t h, int64_t w, DType dt) {
  std::array<int64_t, 5> key{n, c, h, w, int64_t(dt)};
  auto it = descs_.find(key);
  if (it != descs_.end()) return it->second->get();
  SHOAL_CHECK(n * c * h * w <= INT_MAX,
              Where("cuDNN") + ": tensor " + Dims({n, c, h, w}) + " has more than 2^31-1 elements");
  auto d = std::make_unique<cudautil::TensorDesc>();
  Check(cudnnSetTensor4dDescriptor(d->get(), CUDNN_TENSOR_NCHW, cudautil::CudnnType(dt), AsInt(n, "N"), AsInt(c, "C"),
                                   AsInt(h, "H"), AsInt(w, "W")),
        Where("cudnnSetTensor4dDescriptor") + " " + Dims({n, c, h, w}));
  cudnnTensorDescriptor_t raw = d->get();
  descs_.emplace(key, std::move(d));
  return raw;
}

void* CudaBackend::Scratch(size_t bytes) {
  if (bytes > scratch_bytes_) {
    scratch_ = alloc_->Allocate(bytes);
    scratch_bytes_ = bytes;
  }
  return scratch_.get();
}

void* CudaBackend::Workspace(size_t bytes) {
  if (bytes == 0) return nullptr;
  if (bytes > workspace_bytes_) {
    workspace_.reset();  // give the old block back first so the pool can reuse its memory
    workspace_ = alloc_->Allocate(bytes);
    workspace_bytes_ = bytes;
  }
  return workspace_.get();
}

// ---- memory

Tensor CudaBackend::Empty(const Shape& shape, DType dtype) {
  for (int64_t d : shape) SHOAL_CHECK(d >= 0, Where("Empty") + ": negative dimension in " + Dims(shape));
  Activate();
  size_t bytes = size_t(NumElements(shape)) * DTypeSize(dtype);
  return Tensor(shape, dtype, device(), alloc_->Allocate(bytes));
}

void CudaBackend::Fill(Tensor& t, float value) {
  Expect(t, "Fill", "t", t.dtype());
  Activate();
  Check(cudak::Fill(t.raw(), ElemType(t.dtype()), t.numel(), value, stream_), Where("Fill"));
}

void CudaBackend::CopyFromHostAsync(Tensor& dst, const void* src) {
  Expect(dst, "CopyFromHost", "dst", dst.dtype());
  SHOAL_CHECK(src != nullptr || dst.bytes() == 0, Where("CopyFromHost") + ": null host pointer");
  Activate();
  Check(cudaMemcpyAsync(dst.raw(), src, dst.bytes(), cudaMemcpyHostToDevice, stream_), Where("CopyFromHost"));
}

void CudaBackend::CopyToHostAsync(const Tensor& src, void* dst) {
  Expect(src, "CopyToHost", "src", src.dtype());
  SHOAL_CHECK(dst != nullptr || src.bytes() == 0, Where("CopyToHost") + ": null host pointer");
  Activate();
  Check(cudaMemcpyAsync(dst, src.raw(), src.bytes(), cudaMemcpyDeviceToHost, stream_), Where("CopyToHost"));
}

// Waiting keeps the synchronous copies safe for pinned host memory, which the caller may
// reuse (or read) at once.
void CudaBackend::CopyFromHost(Tensor& dst, const void* src) {
  CopyFromHostAsync(dst, src);
  Check(cudaStreamSynchronize(stream_), Where("CopyFromHost"));
}

void CudaBackend::CopyToHost(const Tensor& src, void* dst) {
  CopyToHostAsync(src, dst);
  Check(cudaStreamSynchronize(stream_), Where("CopyToHost"));
}

std::shared_ptr<void> CudaBackend::AllocHost(size_t bytes) {
  Activate();
  void* p = nullptr;
  Check(cudaMallocHost(&p, bytes ? bytes : 1), Where("AllocHost") + " (" + std::to_string(bytes) + " bytes pinned)");
  return std::shared_ptr<void>(p, [](void* q) { cudaFreeHost(q); });
}

void CudaBackend::Copy(const Tensor& src, Tensor& dst) {
  Expect(src, "Copy", "src", src.dtype());
  Expect(dst, "Copy", "dst", dst.dtype());
  SHOAL_CHECK(src.numel() == dst.numel(), Where("Copy") + ": src " + Dims(src.shape()) + " and dst " +
                                              Dims(dst.shape()) + " differ in element count");
  Activate();
  if (src.dtype() == dst.dtype()) {
    Check(cudaMemcpyAsync(dst.raw(), src.raw(), src.bytes(), cudaMemcpyDeviceToDevice, stream_), Where("Copy"));
  } else {
    Check(cudak::Cast(src.raw(), ElemType(src.dtype()), dst.raw(), ElemType(dst.dtype()), src.numel(), stream_),
          Where("Copy (dtype conversion)"));
  }
}

// One event per marker, destroyed with its last reference (a few microseconds to create).
std::shared_ptr<const DeviceFence> CudaBackend::RecordFence() {
  Activate();
  return RecordCudaFence(stream_, Where("RecordFence"));
}

void CudaBackend::Synchronize() {
  Activate();
  Check(cudaStreamSynchronize(stream_), Where("Synchronize"));
}

// ---- elementwise (any one element type per call)

void CudaBackend::ReluForward(const Tensor& x, Tensor& y) {
  const DType dt = x.dtype();
  Expect(x, "ReluForward", "x", dt);
  Expect(y, "ReluForward", "y", dt);
  ExpectShape(y, x.shape(), "ReluForward", "y");
  Activate();
  Check(cudak::ReluForward(ElemType(dt), x.raw(), y.raw(), x.numel(), stream_), Where("ReluForward"));
}

void CudaBackend::ReluBackward(const Tensor& y, const Tensor& dy, Tensor& dx) {
  const DType dt = y.dtype();
  Expect(y, "ReluBackward", "y", dt);
  Expect(dy, "ReluBackward", "dy", dt);
  Expect(dx, "ReluBackward", "dx", dt);
  ExpectShape(dy, y.shape(), "ReluBackward", "dy");
  ExpectShape(dx, y.shape(), "ReluBackward", "dx");
  Activate();
  Check(cudak::ReluBackward(ElemType(dt), y.raw(), dy.raw(), dx.raw(), y.numel(), stream_), Where("ReluBackward"));
}

void CudaBackend::Add(const Tensor& a, const Tensor& b, Tensor& y) {
  const DType dt = a.dtype();
  Expect(a, "Add", "a", dt);
  Expect(b, "Add", "b", dt);
  Expect(y, "Add", "y", dt);
  ExpectShape(b, a.shape(), "Add", "b");
  ExpectShape(y, a.shape(), "Add", "y");
  Activate();
  Check(cudak::Add(ElemType(dt), a.raw(), b.raw(), y.raw(), a.numel(), stream_), Where("Add"));
}

void CudaBackend::Axpy(float alpha, const Tensor& x, Tensor& y) {
  const DType dt = x.dtype();
  Expect(x, "Axpy", "x", dt);
  Expect(y, "Axpy", "y", dt);
  SHOAL_CHECK(x.numel() == y.numel(),
              Where("Axpy") + ": x " + Dims(x.shape()) + " and y " + Dims(y.shape()) + " differ in element count");
  Activate();
  Check(cudak::Axpy(ElemType(dt), alpha, x.raw(), y.raw(), x.numel(), stream_), Where("Axpy"));
}

void CudaBackend::Scale(float alpha, Tensor& x) {
  Expect(x, "Scale", "x", x.dtype());
  Activate();
  Check(cudak::Scale(ElemType(x.dtype()), alpha, x.raw(), x.numel(), stream_), Where("Scale"));
}

// ---- global average pooling

void CudaBackend::GlobalAvgPoolForward(const Tensor& x, Tensor& y) {
  const DType dt = x.dtype();
  Expect(x, "GlobalAvgPoolForward", "x", dt);
  Expect(y, "GlobalAvgPoolForward", "y", dt);
  SHOAL_CHECK(x.ndim() == 4, Where("GlobalAvgPoolForward") + ": x must be [N,C,H,W], got " + Dims(x.shape()));
  ExpectShape(y, {x.dim(0), x.dim(1)}, "GlobalAvgPoolForward", "y");
  SHOAL_CHECK(x.dim(2) * x.dim(3) > 0, Where("GlobalAvgPoolForward") + ": empty spatial extent " + Dims(x.shape()));
  Activate();
  Check(cudak::GlobalAvgPoolForward(ElemType(dt), x.raw(), y.raw(), x.dim(0) * x.dim(1), x.dim(2) * x.dim(3), stream_),
        Where("GlobalAvgPoolForward"));
}

void CudaBackend::GlobalAvgPoolBackward(const Tensor& dy, Tensor& dx) {
  const DType dt = dx.dtype();
  Expect(dy, "GlobalAvgPoolBackward", "dy", dt);
  Expect(dx, "GlobalAvgPoolBackward", "dx", dt);
  SHOAL_CHECK(dx.ndim() == 4, Where("GlobalAvgPoolBackward") + ": dx must be [N,C,H,W], got " + Dims(dx.shape()));
  ExpectShape(dy, {dx.dim(0), dx.dim(1)}, "GlobalAvgPoolBackward", "dy");
  SHOAL_CHECK(dx.dim(2) * dx.dim(3) > 0, Where("GlobalAvgPoolBackward") + ": empty spatial extent " + Dims(dx.shape()));
  Activate();
  Check(cudak::GlobalAvgPoolBackward(ElemType(dt), dy.raw(), dx.raw(), dx.dim(0) * dx.dim(1), dx.dim(2) * dx.dim(3),
                                     stream_),
        Where("GlobalAvgPoolBackward"));
}

// ---- fully connected. cuBLAS is column-major: a row-major [r, c] matrix is its transpose
// [c, r] with leading dimension c, so y = x w^T is computed as y^T = w x^T, i.e.
// gemm(T, N) of the column-major views w^T [I, O] and x^T [I, N].

void CudaBackend::Gemm(DType dt, bool ta, bool tb, int m, int n, int k, float alpha, const void* a, int lda,
                       const void* b, int ldb, float beta, void* c, int ldc, const char* what) {
  const char* err = dt == DType::kF32
                        ? blas::Sgemm(cublas_, ta, tb, m, n, k, alpha, static_cast<const float*>(a), lda,
                                      static_cast<const float*>(b), ldb, beta, static_cast<float*>(c), ldc)
                        : blas::GemmHalf(cublas_, ElemType(dt), ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  cudautil::CheckBlas(err, Where(what));
}

void CudaBackend::LinearForward(const Tensor& x, const Tensor& w, const Tensor& b, Tensor& y) {
  const DType dt = Mixed() ? DType::kF32 : x.dtype();  // the interface's type
  Expect(x, "LinearForward", "x", dt);
  Expect(w, "LinearForward", "w", dt);
  Expect(y, "LinearForward", "y", dt);
  SHOAL_CHECK(x.ndim() == 2 && w.ndim() == 2,
              Where("LinearForward") + ": x " + Dims(x.shape()) + " and w " + Dims(w.shape()) + " must be 2-D");
  const int64_t n = x.dim(0), in = x.dim(1), out = w.dim(0);
  SHOAL_CHECK(w.dim(1) == in,
              Where("LinearForward") + ": w " + Dims(w.shape()) + " does not match x " + Dims(x.shape()));
  ExpectShape(y, {n, out}, "LinearForward", "y");
  if (b.defined()) {
    Expect(b, "LinearForward", "b", dt);
    ExpectShape(b, {out}, "LinearForward", "b");
  }
  const int N = AsInt(n, "N"), I = AsInt(in, "I"), O = AsInt(out, "O");
  Activate();
  if (Mixed()) return MixedLinearForward(x, w, b, y);
  Gemm(dt, true, false, O, N, I, 1.f, w.raw(), int(in), x.raw(), int(in), 0.f, y.raw(), int(out), "LinearForward gemm");
  if (b.defined())
    Check(cudak::BiasAdd(ElemType(dt), y.raw(), b.raw(), n, out, 1, stream_), Where("LinearForward bias"));
}

void CudaBackend::LinearBackward(const Tensor& x, const Tensor& w, const Tensor& dy, Tensor* dx, Tensor& dw,
                                 Tensor* db) {
  const DType dt = Mixed() ? DType::kF32 : x.dtype();  // the interface's type
  Expect(x, "LinearBackward", "x", dt);
  Expect(w, "LinearBackward", "w", dt);
  Expect(dy, "LinearBackward", "dy", dt);
  Expect(dw, "LinearBackward", "dw", dt);
  SHOAL_CHECK(x.ndim() == 2 && w.ndim() == 2,
              Where("LinearBackward") + ": x " + Dims(x.shape()) + " and w " + Dims(w.shape()) + " must be 2-D");
  const int64_t n = x.dim(0), in = x.dim(1), out = w.dim(0);
  SHOAL_CHECK(w.dim(1) == in,
              Where("LinearBackward") + ": w " + Dims(w.shape()) + " does not match x " + Dims(x.shape()));
  ExpectShape(dy, {n, out}, "LinearBackward", "dy");
  ExpectShape(dw, w.shape(), "LinearBackward", "dw");
  if (db != nullptr) {
    Expect(*db, "LinearBackward", "db", dt);
    ExpectShape(*db, {out}, "LinearBackward", "db");
  }
  if (dx != nullptr) {
    Expect(*dx, "LinearBackward", "dx", dt);
    ExpectShape(*dx, x.shape(), "LinearBackward", "dx");
  }
  const int N = AsInt(n, "N"), I = AsInt(in, "I"), O = AsInt(out, "O");
  Activate();
  if (Mixed()) return MixedLinearBackward(x, w, dy, dx, dw, db);
  // dw^T [I, O] += x^T [I, N] * (dy^T [O, N])^T
  Gemm(dt, false, true, I, O, N, 1.f, x.raw(), I, dy.raw(), O, 1.f, dw.raw(), I, "LinearBackward dw gemm");
  if (db != nullptr)
    Check(cudak::BiasGradAccumulate(ElemType(dt), dy.raw(), db->raw(), n, out, 1, stream_), Where("LinearBackward db"));
  // dx^T [I, N] = w^T [I, O] * dy^T [O, N]
  if (dx != nullptr)
    Gemm(dt, false, false, I, N, O, 1.f, w.raw(), I, dy.raw(), O, 0.f, dx->raw(), I, "LinearBackward dx gemm");
}

// ---- loss

float CudaBackend::SoftmaxCrossEntropy(const Tensor& logits, const int32_t* labels, float smoothing, Tensor* dlogits,
                                       int64_t* correct) {
  const char* op = "SoftmaxCrossEntropy";
  Expect(logits, op, "logits");
  SHOAL_CHECK(logits.ndim() == 2 && logits.dim(0) > 0 && logits.dim(1) > 0,
              Where(op) + ": logits must be a non-empty [N,K], got " + Dims(logits.shape()));
  SHOAL_CHECK(labels != nullptr, Where(op) + ": labels pointer is null");
  SHOAL_CHECK(smoothing >= 0.f && smoothing <= 1.f,
              Where(op) + ": label smoothing " + std::to_string(smoothing) + " outside [0, 1]");
  const int64_t n = logits.dim(0), k = logits.dim(1);
  for (int64_t i = 0; i < n; ++i)
    SHOAL_CHECK(labels[i] >= 0 && labels[i] < k, Where(op) + ": label[" + std::to_string(i) +
                                                     "] = " + std::to_string(labels[i]) + " outside [0, " +
                                                     std::to_string(k) + ")");
  if (dlogits != nullptr) {
    Expect(*dlogits, op, "dlogits");
    ExpectShape(*dlogits, logits.shape(), op, "dlogits");
  }
  Activate();
  // Scratch layout: labels int32[n] | row losses float[n] | row hits int32[n].
  const size_t part = Align256(size_t(n) * 4);
  char* s = static_cast<char*>(Scratch(3 * part));
  auto* d_labels = reinterpret_cast<int32_t*>(s);
  auto* d_loss = reinterpret_cast<float*>(s + part);
  auto* d_hit = reinterpret_cast<int32_t*>(s + 2 * part);
  Check(cudaMemcpyAsync(d_labels, labels, size_t(n) * 4, cudaMemcpyHostToDevice, stream_),
        Where(op) + " labels upload");
  Check(cudak::SoftmaxCrossEntropy(logits.data<float>(), d_labels, n, k, smoothing,
                                   dlogits ? dlogits->data<float>() : nullptr, d_loss, d_hit, stream_),
        Where(op));
  std::vector<char> host(2 * part);
  Check(cudaMemcpyAsync(host.data(), s + part, 2 * part, cudaMemcpyDeviceToHost, stream_),
        Where(op) + " result download");
  Check(cudaStreamSynchronize(stream_), Where(op));
  const float* loss = reinterpret_cast<const float*>(host.data());
  const int32_t* hit = reinterpret_cast<const int32_t*>(host.data() + part);
  double total = 0;
  int64_t hits = 0;
  for (int64_t i = 0; i < n; ++i) {
    total += loss[i];
    hits += hit[i];
  }
  if (correct != nullptr) *correct = hits;
  return float(total / double(n));
}

double CudaBackend::SumSquares(const Tensor& x) {
  Expect(x, "SumSquares", "x");
  Activate();
  auto* partials = static_cast<double*>(Scratch(cudak::kSumSquaresBlocks * sizeof(double)));
  Check(cudak::SumSquaresPartials(x.data<float>(), x.numel(), partials, stream_), Where("SumSquares"));
  std::vector<double> host(cudak::kSumSquaresBlocks);
  Check(cudaMemcpyAsync(host.data(), partials, host.size() * sizeof(double), cudaMemcpyDeviceToHost, stream_),
        Where("SumSquares"));
  Check(cudaStreamSynchronize(stream_), Where("SumSquares"));
  double total = 0;
  for (double v : host) total += v;
  return total;
}

// ---- factories declared in backend.h

std::unique_ptr<Backend> MakeCudaBackend(int index, DType compute, bool allow_tf32) {
  std::string why;
  bool transient = false;
  const int n = CudaDeviceCount(&why, &transient);
  // Devices busy (exclusive mode) or not ready yet may be there on a retry; none is the machine.
  if (n == 0 && transient) throw TransientError("CUDA devices unavailable: " + why);
  if (n == 0) throw Error("no CUDA device: " + why);
  SHOAL_CHECK(index >= 0 && index < n,
              "cuda:" + std::to_string(index) + " does not exist: " + std::to_string(n) + " CUDA device(s) present");
  CudaBackend::Options options;
  options.compute = compute;
  options.allow_tf32 = allow_tf32;
  return std::make_unique<CudaBackend>(index, options);
}

}  // namespace shoal
