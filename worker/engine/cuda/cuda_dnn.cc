// Batch normalization, max and average pooling on cuDNN.
#include "common/error.h"
#include "worker/engine/cuda/cuda_backend.h"

namespace shoal {

using cudautil::Check;

namespace {

std::string Dims(const Shape& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? "," : "") + std::to_string(s[i]);
  return r + "]";
}

}  // namespace

void CudaBackend::BnDescs(const Tensor& x, const char* op, cudnnTensorDescriptor_t* xd, cudnnTensorDescriptor_t* pd,
                          int64_t* c, int64_t* hw) {
  SHOAL_CHECK(x.ndim() == 4 || x.ndim() == 2, Where(op) + ": x must be [N,C,H,W] or [N,C], got " + Dims(x.shape()));
  // [N,C] is batch norm with H = W = 1: per-channel statistics over the batch.
  const int64_t h = x.ndim() == 4 ? x.dim(2) : 1, w = x.ndim() == 4 ? x.dim(3) : 1;
  *c = x.dim(1);
  *hw = h * w;
  // fp16/bf16 activations still take fp32 parameters and statistics, as cuDNN requires.
  *xd = Desc4d(x.dim(0), *c, h, w, x.dtype());
  *pd = Desc4d(1, *c, 1, 1, DType::kF32);
}

void CudaBackend::BatchNormForwardTrain(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps,
                                        float momentum, Tensor& running_mean, Tensor& running_var, Tensor& save_mean,
                                        Tensor& save_invstd, Tensor& y) {
  const char* op = "BatchNormForwardTrain";
  Expect(x, op, "x", x.dtype());
  Activate();
  cudnnTensorDescriptor_t xd, pd;
  int64_t bn_c, bn_hw;
  BnDescs(x, op, &xd, &pd, &bn_c, &bn_hw);
  SHOAL_CHECK(x.dim(0) * bn_hw > 1,
              Where(op) + ": " + Dims(x.shape()) + " has one value per channel; the unbiased variance needs two");
  SHOAL_CHECK(eps > 0.f, Where(op) + ": eps must be positive, got " + std::to_string(eps));
  SHOAL_CHECK(momentum >= 0.f && momentum <= 1.f,
              Where(op) + ": momentum " + std::to_string(momentum) + " outside [0, 1]");
  const Shape c{bn_c};
  const Tensor* params[] = {&gamma, &beta, &running_mean, &running_var, &save_mean, &save_invstd};
  const char* names[] = {"gamma", "beta", "running_mean", "running_var", "save_mean", "save_invstd"};
  for (int i = 0; i < 6; ++i) {
    Expect(*params[i], op, names[i]);
    ExpectShape(*params[i], c, op, names[i]);
  }
  Expect(y, op, "y", x.dtype());
  ExpectShape(y, x.shape(), op, "y");
  const float one = 1.f, zero = 0.f;
  // cuDNN's update is running = (1 - factor) running + factor batch, with the unbiased
  // variance for running_var, and it saves 1/sqrt(var + eps): the Backend contract exactly.
  Check(cudnnBatchNormalizationForwardTraining(cudnn_, CUDNN_BATCHNORM_SPATIAL, &one, &zero, xd, x.raw(), xd, y.raw(),
                                               pd, gamma.raw(), beta.raw(), double(momentum), running_mean.raw(),
                                               running_var.raw(), double(eps), save_mean.raw(), save_invstd.raw()),
        Where("cudnnBatchNormalizationForwardTraining") + " " + Dims(x.shape()));
}

void CudaBackend::BatchNormForwardInference(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                            const Tensor& running_mean, const Tensor& running_var, float eps,
                                            Tensor& y) {
  const char* op = "BatchNormForwardInference";
  Expect(x, op, "x", x.dtype());
  Activate();
  cudnnTensorDescriptor_t xd, pd;
  int64_t bn_c, bn_hw;
  BnDescs(x, op, &xd, &pd, &bn_c, &bn_hw);
  SHOAL_CHECK(eps > 0.f, Where(op) + ": eps must be positive, got " + std::to_string(eps));
  const Shape c{bn_c};
  const Tensor* params[] = {&gamma, &beta, &running_mean, &running_var};
  const char* names[] = {"gamma", "beta", "running_mean", "running_var"};
  for (int i = 0; i < 4; ++i) {
    Expect(*params[i], op, names[i]);
    ExpectShape(*params[i], c, op, names[i]);
  }
  Expect(y, op, "y", x.dtype());
  ExpectShape(y, x.shape(), op, "y");
  const float one = 1.f, zero = 0.f;
  Check(cudnnBatchNormalizationForwardInference(cudnn_, CUDNN_BATCHNORM_SPATIAL, &one, &zero, xd, x.raw(), xd, y.raw(),
                                                pd, gamma.raw(), beta.raw(), running_mean.raw(), running_var.raw(),
                                                double(eps)),
        Where("cudnnBatchNormalizationForwardInference") + " " + Dims(x.shape()));
}

void CudaBackend::BatchNormBackward(const Tensor& x, const Tensor& dy, const Tensor& gamma, const Tensor& save_mean,
                                    const Tensor& save_invstd, float eps, Tensor& dx, Tensor& dgamma, Tensor& dbeta) {
  const char* op = "BatchNormBackward";
  Expect(x, op, "x", x.dtype());
  Activate();
  cudnnTensorDescriptor_t xd, pd;
  int64_t bn_c, bn_hw;
  BnDescs(x, op, &xd, &pd, &bn_c, &bn_hw);
  const Shape c{bn_c};
  const Tensor* params[] = {&gamma, &save_mean, &save_invstd, &dgamma, &dbeta};
  const char* names[] = {"gamma", "save_mean", "save_invstd", "dgamma", "dbeta"};
  for (int i = 0; i < 5; ++i) {
    Expect(*params[i], op, names[i]);
    ExpectShape(*params[i], c, op, names[i]);
  }
  Expect(dy, op, "dy", x.dtype());
  ExpectShape(dy, x.shape(), op, "dy");
  Expect(dx, op, "dx", x.dtype());
  ExpectShape(dx, x.shape(), op, "dx");
  const float one = 1.f, zero = 0.f;
  // Data gradient overwrites (beta 0); parameter gradients accumulate (beta 1).
  Check(cudnnBatchNormalizationBackward(cudnn_, CUDNN_BATCHNORM_SPATIAL, &one, &zero, &one, &one, xd, x.raw(), xd,
                                        dy.raw(), xd, dx.raw(), pd, gamma.raw(), dgamma.raw(), dbeta.raw(),
                                        // cuDNN asks for the forward's epsilon beside the saved statistics.
                                        double(eps), save_mean.raw(), save_invstd.raw()),
        Where("cudnnBatchNormalizationBackward") + " " + Dims(x.shape()));
}

namespace {

std::string PoolGeometry(const PoolParams& p) {
  return "kernel " + std::to_string(p.kh()) + "x" + std::to_string(p.kw()) + " stride " + std::to_string(p.sh()) + "x" +
         std::to_string(p.sw()) + " pad " + std::to_string(p.ph()) + "x" + std::to_string(p.pw());
}

void SetPool(cudnnPoolingDescriptor_t d, cudnnPoolingMode_t mode, const PoolParams& p, const std::string& where) {
  // A window lying wholly in the padding would have nothing to pool (or average over).
  SHOAL_CHECK(p.kh() >= 1 && p.kw() >= 1 && p.sh() >= 1 && p.sw() >= 1 && p.ph() >= 0 && p.pw() >= 0 &&
                  p.ph() < p.kh() && p.pw() < p.kw(),
              where + ": bad pooling " + PoolGeometry(p));
  Check(cudnnSetPooling2dDescriptor(d, mode, CUDNN_NOT_PROPAGATE_NAN, p.kh(), p.kw(), p.ph(), p.pw(), p.sh(), p.sw()),
        where + " cudnnSetPooling2dDescriptor " + PoolGeometry(p));
}

cudnnPoolingMode_t AvgMode(const PoolParams& p) {
  return p.count_include_pad ? CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING
                             : CUDNN_POOLING_AVERAGE_COUNT_EXCLUDE_PADDING;
}

struct PooledDims {
  int n = 0, c = 0, h = 0, w = 0;
};

// The pooled output's dimensions as cuDNN computes them for input x (descriptor xd); a window
// larger than the padded input would give an empty output, refused by name.
PooledDims PooledOutput(cudnnPoolingDescriptor_t pool, cudnnTensorDescriptor_t xd, const PoolParams& p, const Tensor& x,
                        const std::string& where) {
  PooledDims d;
  Check(cudnnGetPooling2dForwardOutputDim(pool, xd, &d.n, &d.c, &d.h, &d.w), where);
  SHOAL_CHECK(d.h > 0 && d.w > 0,
              where + ": window " + PoolGeometry(p) + " larger than the padded input " + Dims(x.shape()));
  return d;
}

}  // namespace

void CudaBackend::MaxPoolForward(const Tensor& x, const PoolParams& p, Tensor& y, Tensor& /*workspace*/) {
  const char* op = "MaxPoolForward";
  const DType dt = x.dtype();
  Expect(x, op, "x", dt);
  Expect(y, op, "y", dt);
  SHOAL_CHECK(x.ndim() == 4, Where(op) + ": x must be [N,C,H,W], got " + Dims(x.shape()));
  Activate();
  cudautil::PoolDesc pool;
  SetPool(pool.get(), CUDNN_POOLING_MAX_DETERMINISTIC, p, Where(op));
  cudnnTensorDescriptor_t xd = Desc4d(x.dim(0), x.dim(1), x.dim(2), x.dim(3), dt);
  const auto [n, c, h, w] = PooledOutput(pool.get(), xd, p, x, Where(op));
  ExpectShape(y, {n, c, h, w}, op, "y");
  cudnnTensorDescriptor_t yd = Desc4d(n, c, h, w, dt);
  const float one = 1.f, zero = 0.f;
  Check(cudnnPoolingForward(cudnn_, pool.get(), &one, xd, x.raw(), &zero, yd, y.raw()), Where("cudnnPoolingForward"));
}

void CudaBackend::MaxPoolBackward(const Tensor& x, const Tensor& y, const Tensor& dy, const PoolParams& p,
                                  const Tensor& /*workspace*/, Tensor& dx) {
  const char* op = "MaxPoolBackward";
  const DType dt = x.dtype();
  Expect(x, op, "x", dt);
  Expect(y, op, "y", dt);
  Expect(dy, op, "dy", dt);
  Expect(dx, op, "dx", dt);
  SHOAL_CHECK(x.ndim() == 4, Where(op) + ": x must be [N,C,H,W], got " + Dims(x.shape()));
  ExpectShape(dx, x.shape(), op, "dx");
  Activate();
  cudautil::PoolDesc pool;
  SetPool(pool.get(), CUDNN_POOLING_MAX_DETERMINISTIC, p, Where(op));
  cudnnTensorDescriptor_t xd = Desc4d(x.dim(0), x.dim(1), x.dim(2), x.dim(3), dt);
  const auto [n, c, h, w] = PooledOutput(pool.get(), xd, p, x, Where(op));
  ExpectShape(y, {n, c, h, w}, op, "y");
  ExpectShape(dy, {n, c, h, w}, op, "dy");
  cudnnTensorDescriptor_t yd = Desc4d(n, c, h, w, dt);
  const float one = 1.f, zero = 0.f;
  Check(cudnnPoolingBackward(cudnn_, pool.get(), &one, yd, y.raw(), yd, dy.raw(), xd, x.raw(), &zero, xd, dx.raw()),
        Where("cudnnPoolingBackward"));
}

// Average pooling: fp32 like the other ops of imported graphs.
void CudaBackend::AvgPoolForward(const Tensor& x, const PoolParams& p, Tensor& y) {
  const char* op = "AvgPoolForward";
  Expect(x, op, "x");
  Expect(y, op, "y");
  SHOAL_CHECK(x.ndim() == 4, Where(op) + ": x must be [N,C,H,W], got " + Dims(x.shape()));
  Activate();
  cudautil::PoolDesc pool;
  SetPool(pool.get(), AvgMode(p), p, Where(op));
  cudnnTensorDescriptor_t xd = Desc4d(x.dim(0), x.dim(1), x.dim(2), x.dim(3));
  const auto [n, c, h, w] = PooledOutput(pool.get(), xd, p, x, Where(op));
  ExpectShape(y, {n, c, h, w}, op, "y");
  const float one = 1.f, zero = 0.f;
  Check(cudnnPoolingForward(cudnn_, pool.get(), &one, xd, x.raw(), &zero, Desc4d(n, c, h, w), y.raw()),
        Where("cudnnPoolingForward") + " (average) " + Dims(x.shape()) + " " + PoolGeometry(p));
}

void CudaBackend::AvgPoolBackward(const Tensor& dy, const PoolParams& p, Tensor& dx) {
  const char* op = "AvgPoolBackward";
  Expect(dy, op, "dy");
  Expect(dx, op, "dx");
  SHOAL_CHECK(dx.ndim() == 4, Where(op) + ": dx must be [N,C,H,W], got " + Dims(dx.shape()));
  Activate();
  cudautil::PoolDesc pool;
  SetPool(pool.get(), AvgMode(p), p, Where(op));
  cudnnTensorDescriptor_t xd = Desc4d(dx.dim(0), dx.dim(1), dx.dim(2), dx.dim(3));
  const auto [n, c, h, w] = PooledOutput(pool.get(), xd, p, dx, Where(op));
  ExpectShape(dy, {n, c, h, w}, op, "dy");
  cudnnTensorDescriptor_t yd = Desc4d(n, c, h, w);
  // cuDNN's backward takes the forward's x and y, which an average's gradient does not
  // depend on; the contract keeps neither, so dy stands in for y and an x-sized scratch
  // buffer (its contents unused) for x, leaving dx unaliased.
  void* x_stand_in = Scratch(dx.bytes());
  const float one = 1.f, zero = 0.f;
  Check(cudnnPoolingBackward(cudnn_, pool.get(), &one, yd, dy.raw(), yd, dy.raw(), xd, x_stand_in, &zero, xd, dx.raw()),
        Where("cudnnPoolingBackward") + " (average) " + Dims(dx.shape()) + " " + PoolGeometry(p));
}

}  // namespace shoal
