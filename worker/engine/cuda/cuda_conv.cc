// Convolution on cuDNN's legacy API: descriptors and algorithms are chosen once per shape
// (cudnnGet*Algorithm_v7 heuristics, which cost no device time or memory) and cached.
#include <climits>
#include <vector>

#include "common/error.h"
#include "worker/engine/cuda/cuda_backend.h"
#include "worker/engine/cuda/kernels.h"

namespace shoal {

using cudautil::Check;
using cudautil::ElemType;

namespace {

bool TensorOpMath(cudnnMathType_t m) { return m == CUDNN_TENSOR_OP_MATH || m == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION; }

std::string Dims(const Shape& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? "," : "") + std::to_string(s[i]);
  return r + "]";
}

// Walks the heuristic ranking and takes the first algorithm that runs in the requested
// math mode within the workspace limit. `workspace(algo, &bytes)` asks cuDNN for its size.
// exact_fp32: fp32 data without TF32, so only FMA kernels qualify; otherwise the algorithm's
// own math type (tensor cores for fp16/bf16, TF32 when allowed), then cuDNN's default math and
// plain FMA: a deterministic algorithm that cuDNN will not size in the ranked math type (seen
// for backward data in TF32 at resnet50's shapes) still runs in another.
// deterministic: only algorithms cuDNN reports as giving the same bits on every run (some
// backward ones sum with atomics): the synchronous algorithms promise bit-identical weights on
// every worker and after --resume, which one non-deterministic gradient breaks.
// On failure `why` says what each ranked algorithm was refused for.
template <typename Perf, typename Algo, typename SizeFn>
bool PickAlgo(const std::vector<Perf>& ranked, int count, bool exact_fp32, bool deterministic, size_t max_bytes,
              cudnnConvolutionDescriptor_t conv, SizeFn workspace, Algo* algo, cudnnMathType_t* math, size_t* bytes,
              std::string* why) {
  why->clear();
  for (int i = 0; i < count; ++i) {
    const Perf& r = ranked[i];
    const std::string name = "; algorithm " + std::to_string(int(r.algo));
    if (r.status != CUDNN_STATUS_SUCCESS) {
      *why += name + ": " + cudnnGetErrorString(r.status);
      continue;
    }
    if (deterministic && r.determinism != CUDNN_DETERMINISTIC) {
      *why += name + ": not deterministic";
      continue;
    }
    if (exact_fp32 && TensorOpMath(r.mathType)) {
      *why += name + ": tensor-core math only (TF32 is off)";
      continue;
    }
    std::vector<cudnnMathType_t> maths = {CUDNN_FMA_MATH};
    if (!exact_fp32) maths = {r.mathType, CUDNN_DEFAULT_MATH, CUDNN_FMA_MATH};
    cudnnMathType_t prev = cudnnMathType_t(-1);
    for (cudnnMathType_t m : maths) {
      if (m == prev) continue;
      prev = m;
      size_t need = 0;
      cudnnStatus_t st = cudnnSetConvolutionMathType(conv, m);
      if (st == CUDNN_STATUS_SUCCESS) st = workspace(r.algo, &need);
      if (st != CUDNN_STATUS_SUCCESS || need > max_bytes) {
        *why += name + " math " + std::to_string(int(m)) + ": " +
                (st != CUDNN_STATUS_SUCCESS
                     ? std::string(cudnnGetErrorString(st))
                     : "workspace " + std::to_string(need) + " bytes > " + std::to_string(max_bytes));
        continue;
      }
      *algo = r.algo;
      *math = m;
      *bytes = need;
      return true;
    }
  }
  if (why->empty()) *why = "; cuDNN ranked no algorithm";
  return false;
}

}  // namespace

CudaConvPlan& CudaBackend::PlanFor(const Tensor& x, const Tensor& w, const ConvParams& p, const char* op) {
  // Mixed mode: fp32 at the interface, the compute type inside; else one type throughout.
  const DType io = Mixed() ? DType::kF32 : x.dtype();
  const DType dt = Mixed() ? options_.compute : io;
  Expect(x, op, "x", io);
  Expect(w, op, "w", io);
  SHOAL_CHECK(x.ndim() == 4 && w.ndim() == 4,
              Where(op) + ": x " + Dims(x.shape()) + " and w " + Dims(w.shape()) + " must be NCHW and OIHW");
  // Built only for messages: PlanFor runs on every convolution call.
  auto geometry = [&p] {
    return "stride " + std::to_string(p.sh()) + "x" + std::to_string(p.sw()) + " pad " + std::to_string(p.ph()) + "x" +
           std::to_string(p.pw()) + " dilation " + std::to_string(p.dh()) + "x" + std::to_string(p.dw()) + " groups " +
           std::to_string(p.groups);
  };
  SHOAL_CHECK(p.sh() >= 1 && p.sw() >= 1 && p.ph() >= 0 && p.pw() >= 0 && p.dh() >= 1 && p.dw() >= 1 && p.groups >= 1,
              Where(op) + ": " + geometry() + " invalid");
  SHOAL_CHECK(x.dim(1) == w.dim(1) * p.groups && w.dim(0) % p.groups == 0,
              Where(op) + ": x " + Dims(x.shape()) + " has " + std::to_string(x.dim(1)) + " channels but w " +
                  Dims(w.shape()) + " with " + std::to_string(p.groups) + " group(s) expects " +
                  std::to_string(w.dim(1) * p.groups) + " (and output channels divisible by the groups)");
  // NHWC only where every channel count (per group too) is a multiple of 8, what cuDNN's NHWC
  // tensor-core kernels are built for; the 3-channel input layer, depthwise convolutions and
  // other odd shapes stay NCHW.
  const bool nhwc = Mixed() && x.dim(1) % 8 == 0 && w.dim(1) % 8 == 0 && (w.dim(0) / p.groups) % 8 == 0;
  const ConvKey key{x.dim(0), x.dim(1), x.dim(2), x.dim(3), w.dim(0), w.dim(1), w.dim(2),    w.dim(3),     p.sh(),
                    p.sw(),   p.ph(),   p.pw(),   p.dh(),   p.dw(),   p.groups, int64_t(dt), int64_t(nhwc)};
  auto it = plans_.find(key);
  if (it != plans_.end()) return *it->second;

  for (int64_t d : key)
    SHOAL_CHECK(d <= INT_MAX, Where(op) + ": dimension " + std::to_string(d) + " too large for cuDNN");
  auto plan = std::make_unique<CudaConvPlan>();
  const std::string where = Where(op) + " x " + Dims(x.shape()) + " w " + Dims(w.shape()) + " " + geometry();
  const cudnnDataType_t type = cudautil::CudnnType(dt);
  const cudnnTensorFormat_t format = nhwc ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW;
  plan->dtype = dt;
  plan->nhwc = nhwc;
  plan->where = "x " + Dims(x.shape()) + " w " + Dims(w.shape()) + " " + geometry();
  Check(cudnnSetTensor4dDescriptor(plan->x.get(), format, type, int(x.dim(0)), int(x.dim(1)), int(x.dim(2)),
                                   int(x.dim(3))),
        where);
  Check(cudnnSetFilter4dDescriptor(plan->w.get(), type, format, int(w.dim(0)), int(w.dim(1)), int(w.dim(2)),
                                   int(w.dim(3))),
        where);
  Check(cudnnSetConvolution2dDescriptor(plan->conv.get(), p.ph(), p.pw(), p.sh(), p.sw(), p.dh(), p.dw(),
                                        CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT),
        where);
  Check(cudnnSetConvolutionGroupCount(plan->conv.get(), p.groups), where + " cudnnSetConvolutionGroupCount");
  Check(cudnnSetConvolutionMathType(plan->conv.get(), RankingMath(dt)), where);
  int n = 0, o = 0, ho = 0, wo = 0;
  Check(cudnnGetConvolution2dForwardOutputDim(plan->conv.get(), plan->x.get(), plan->w.get(), &n, &o, &ho, &wo), where);
  SHOAL_CHECK(ho > 0 && wo > 0, where + ": kernel larger than the padded input");
  plan->n = n;
  plan->o = o;
  plan->ho = ho;
  plan->wo = wo;
  Check(cudnnSetTensor4dDescriptor(plan->y.get(), format, type, n, o, ho, wo), where);
  auto& ref = *plan;
  plans_.emplace(key, std::move(plan));
  return ref;
}

// The math type the heuristics rank under; reset before each ranking, because picking an
// algorithm leaves the descriptor in that algorithm's math (tensor-op math on fp32 data made
// cuDNN rank no usable backward algorithm). Accumulation is fp32 for every data type.
cudnnMathType_t CudaBackend::RankingMath(DType dt) const {
  return ExactFp32(dt) ? CUDNN_FMA_MATH : dt == DType::kF32 ? CUDNN_DEFAULT_MATH : CUDNN_TENSOR_OP_MATH;
}

void CudaBackend::ChooseForwardAlgo(CudaConvPlan& pl) {
  Check(cudnnSetConvolutionMathType(pl.conv.get(), RankingMath(pl.dtype)), Where("ConvForward"));
  int max_n = 0;
  Check(cudnnGetConvolutionForwardAlgorithmMaxCount(cudnn_, &max_n), Where("ConvForward"));
  std::vector<cudnnConvolutionFwdAlgoPerf_t> ranked(max_n > 0 ? max_n : 1);
  int got = 0;
  Check(cudnnGetConvolutionForwardAlgorithm_v7(cudnn_, pl.x.get(), pl.w.get(), pl.conv.get(), pl.y.get(),
                                               int(ranked.size()), &got, ranked.data()),
        Where("cudnnGetConvolutionForwardAlgorithm_v7"));
  auto size = [&](cudnnConvolutionFwdAlgo_t a, size_t* b) {
    return cudnnGetConvolutionForwardWorkspaceSize(cudnn_, pl.x.get(), pl.w.get(), pl.conv.get(), pl.y.get(), a, b);
  };
  std::string why;
  SHOAL_CHECK(PickAlgo(ranked, got, ExactFp32(pl.dtype), options_.deterministic, options_.max_workspace_bytes,
                       pl.conv.get(), size, &pl.fwd, &pl.fwd_math, &pl.fwd_bytes, &why),
              Where("ConvForward") + " " + pl.where + ": cuDNN offers no usable forward algorithm" + why);
  pl.has_fwd = true;
}

void CudaBackend::ChooseBackwardAlgos(CudaConvPlan& pl) {
  Check(cudnnSetConvolutionMathType(pl.conv.get(), RankingMath(pl.dtype)), Where("ConvBackward"));
  int max_n = 0;
  Check(cudnnGetConvolutionBackwardDataAlgorithmMaxCount(cudnn_, &max_n), Where("ConvBackward"));
  std::vector<cudnnConvolutionBwdDataAlgoPerf_t> data(max_n > 0 ? max_n : 1);
  int got = 0;
  Check(cudnnGetConvolutionBackwardDataAlgorithm_v7(cudnn_, pl.w.get(), pl.y.get(), pl.conv.get(), pl.x.get(),
                                                    int(data.size()), &got, data.data()),
        Where("cudnnGetConvolutionBackwardDataAlgorithm_v7"));
  auto data_size = [&](cudnnConvolutionBwdDataAlgo_t a, size_t* b) {
    return cudnnGetConvolutionBackwardDataWorkspaceSize(cudnn_, pl.w.get(), pl.y.get(), pl.conv.get(), pl.x.get(), a,
                                                        b);
  };
  std::string why;
  SHOAL_CHECK(PickAlgo(data, got, ExactFp32(pl.dtype), options_.deterministic, options_.max_workspace_bytes,
                       pl.conv.get(), data_size, &pl.bwd_data, &pl.bwd_data_math, &pl.bwd_data_bytes, &why),
              Where("ConvBackward") + " " + pl.where + ": cuDNN offers no usable backward-data algorithm" + why);

  Check(cudnnSetConvolutionMathType(pl.conv.get(), RankingMath(pl.dtype)), Where("ConvBackward"));
  Check(cudnnGetConvolutionBackwardFilterAlgorithmMaxCount(cudnn_, &max_n), Where("ConvBackward"));
  std::vector<cudnnConvolutionBwdFilterAlgoPerf_t> filt(max_n > 0 ? max_n : 1);
  Check(cudnnGetConvolutionBackwardFilterAlgorithm_v7(cudnn_, pl.x.get(), pl.y.get(), pl.conv.get(), pl.w.get(),
                                                      int(filt.size()), &got, filt.data()),
        Where("cudnnGetConvolutionBackwardFilterAlgorithm_v7"));
  auto filt_size = [&](cudnnConvolutionBwdFilterAlgo_t a, size_t* b) {
    return cudnnGetConvolutionBackwardFilterWorkspaceSize(cudnn_, pl.x.get(), pl.y.get(), pl.conv.get(), pl.w.get(), a,
                                                          b);
  };
  SHOAL_CHECK(PickAlgo(filt, got, ExactFp32(pl.dtype), options_.deterministic, options_.max_workspace_bytes,
                       pl.conv.get(), filt_size, &pl.bwd_filter, &pl.bwd_filter_math, &pl.bwd_filter_bytes, &why),
              Where("ConvBackward") + " " + pl.where + ": cuDNN offers no usable backward-filter algorithm" + why);
  pl.has_bwd = true;
}

void CudaBackend::ConvForward(const Tensor& x, const Tensor& w, const Tensor& b, const ConvParams& p, Tensor& y) {
  ConvFwd(x, w, b, p, y, nullptr);
}

void CudaBackend::ConvForwardTrain(const Tensor& x, const Tensor& w, const Tensor& b, const ConvParams& p, Tensor& y,
                                   Tensor& saved) {
  ConvFwd(x, w, b, p, y, &saved);
}

void CudaBackend::ConvBackward(const Tensor& x, const Tensor& w, const Tensor& dy, const ConvParams& p, Tensor* dx,
                               Tensor& dw, Tensor* db) {
  ConvBwd(x, nullptr, w, dy, p, dx, dw, db);
}

void CudaBackend::ConvBackwardSaved(const Tensor& x, const Tensor& saved, const Tensor& w, const Tensor& dy,
                                    const ConvParams& p, Tensor* dx, Tensor& dw, Tensor* db) {
  ConvBwd(x, &saved, w, dy, p, dx, dw, db);
}

void CudaBackend::ConvFwd(const Tensor& x, const Tensor& w, const Tensor& b, const ConvParams& p, Tensor& y,
                          Tensor* saved) {
  Activate();
  CudaConvPlan& pl = PlanFor(x, w, p, "ConvForward");
  const DType io = Mixed() ? DType::kF32 : pl.dtype;  // the interface's type
  Expect(y, "ConvForward", "y", io);
  ExpectShape(y, {pl.n, pl.o, pl.ho, pl.wo}, "ConvForward", "y");
  if (b.defined()) {
    Expect(b, "ConvForward", "b", io);
    ExpectShape(b, {pl.o}, "ConvForward", "b");
  }
  if (!pl.has_fwd) ChooseForwardAlgo(pl);
  if (Mixed()) return MixedConvFwd(pl, x, w, b, y, saved);
  // One type throughout: cuDNN reads x directly, nothing worth keeping in `saved`.
  const float one = 1.f, zero = 0.f;
  Check(cudnnSetConvolutionMathType(pl.conv.get(), pl.fwd_math), Where("ConvForward"));
  void* ws = Workspace(pl.fwd_bytes);
  Check(cudnnConvolutionForward(cudnn_, &one, pl.x.get(), x.raw(), pl.w.get(), w.raw(), pl.conv.get(), pl.fwd, ws,
                                pl.fwd_bytes, &zero, pl.y.get(), y.raw()),
        Where("cudnnConvolutionForward"));
  if (b.defined())
    Check(cudak::BiasAdd(ElemType(pl.dtype), y.raw(), b.raw(), pl.n, pl.o, pl.ho * pl.wo, stream_),
          Where("ConvForward bias"));
}

void CudaBackend::ConvBwd(const Tensor& x, const Tensor* saved, const Tensor& w, const Tensor& dy, const ConvParams& p,
                          Tensor* dx, Tensor& dw, Tensor* db) {
  Activate();
  CudaConvPlan& pl = PlanFor(x, w, p, "ConvBackward");
  const DType io = Mixed() ? DType::kF32 : pl.dtype;  // the interface's type
  Expect(dy, "ConvBackward", "dy", io);
  ExpectShape(dy, {pl.n, pl.o, pl.ho, pl.wo}, "ConvBackward", "dy");
  Expect(dw, "ConvBackward", "dw", io);
  ExpectShape(dw, w.shape(), "ConvBackward", "dw");
  if (dx) {
    Expect(*dx, "ConvBackward", "dx", io);
    ExpectShape(*dx, x.shape(), "ConvBackward", "dx");
  }
  if (db) {
    Expect(*db, "ConvBackward", "db", io);
    ExpectShape(*db, {pl.o}, "ConvBackward", "db");
  }
  if (!pl.has_bwd) ChooseBackwardAlgos(pl);
  if (Mixed()) return MixedConvBwd(pl, x, saved, w, dy, dx, dw, db);
  (void)saved;  // one type throughout: cuDNN reads x directly
  const float one = 1.f, zero = 0.f;
  // beta = 1 accumulates into dw, as the Backend contract asks of parameter gradients.
  Check(cudnnSetConvolutionMathType(pl.conv.get(), pl.bwd_filter_math), Where("ConvBackward"));
  void* ws = Workspace(pl.bwd_filter_bytes);
  Check(cudnnConvolutionBackwardFilter(cudnn_, &one, pl.x.get(), x.raw(), pl.y.get(), dy.raw(), pl.conv.get(),
                                       pl.bwd_filter, ws, pl.bwd_filter_bytes, &one, pl.w.get(), dw.raw()),
        Where("cudnnConvolutionBackwardFilter"));
  if (db)
    Check(cudak::BiasGradAccumulate(ElemType(pl.dtype), dy.raw(), db->raw(), pl.n, pl.o, pl.ho * pl.wo, stream_),
          Where("ConvBackward db"));
  if (dx) {
    Check(cudnnSetConvolutionMathType(pl.conv.get(), pl.bwd_data_math), Where("ConvBackward"));
    ws = Workspace(pl.bwd_data_bytes);
    Check(cudnnConvolutionBackwardData(cudnn_, &one, pl.w.get(), w.raw(), pl.y.get(), dy.raw(), pl.conv.get(),
                                       pl.bwd_data, ws, pl.bwd_data_bytes, &zero, pl.x.get(), dx->raw()),
          Where("cudnnConvolutionBackwardData"));
  }
}

}  // namespace shoal
