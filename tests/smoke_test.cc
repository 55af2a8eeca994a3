#include <zmq.hpp>
#include <capnp/message.h>
#include <toml++/toml.h>
#include <rocksdb/db.h>
#include <dnnl.hpp>
#include <glog/logging.h>
#include <gflags/gflags.h>
#include <gtest/gtest.h>
#include <cuda_runtime.h>
TEST(Smoke, Works) { int n=0; auto e = cudaGetDeviceCount(&n); printf("cuda err %d n %d %s\n", (int)e, n, cudaGetErrorString(e)); dnnl::engine eng(dnnl::engine::kind::cpu, 0); EXPECT_EQ(1,1); }
