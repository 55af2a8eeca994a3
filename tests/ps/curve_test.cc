// CurveZMQ: with keys in the job file, a client holding them works, and a client without
// them (plaintext, or another key pair) is refused with a clear line in the server log.
#include <gtest/gtest.h>

#include "common/config.h"
#include "common/error.h"
#include "common/transport/transport.h"
#include "tests/ps/ps_test_util.h"
#include "common/ps/client.h"

namespace shoal {
namespace {

using testing::ServerProcess;

class Curve : public ::testing::Test {
 protected:
  void SetUp() override {
    auto server = CurveKeyPair(), client = CurveKeyPair();
    std::string sec = "[security]\nserver_public_key = \"" + server.first + "\"\nserver_secret_key = \"" +
                      server.second + "\"\nclient_public_key = \"" + client.first + "\"\nclient_secret_key = \"" +
                      client.second + "\"\n";
    job_ = testing::WriteJob("curve", 2, 1, sec);
    cfg_ = LoadJobConfig(job_);
    ASSERT_TRUE(cfg_.curve_enabled());
    s0_ = std::make_unique<ServerProcess>(job_, 0);
    s1_ = std::make_unique<ServerProcess>(job_, 1);
    ASSERT_TRUE(s0_->WaitForLog("(CURVE)")) << s0_->log();
    ASSERT_TRUE(s1_->WaitForLog("(CURVE)")) << s1_->log();
  }

  // Registers and round-trips one tensor; throws if refused.
  static void RoundTrip(const JobConfig& cfg, int timeout_ms = 10000) {
    ClientOptions o;
    o.timeout_ms = timeout_ms;
    o.heartbeat = false;
    Client c(cfg, o);
    c.Register({{"w", DType::kF32, {256}}, {"v", DType::kF32, {128}}});
    std::vector<float> w(256, 2.0f), v(128, -1.0f);
    c.Wait(c.Push({{"w", DType::kF32, {256}, w.data(), 1024}, {"v", DType::kF32, {128}, v.data(), 512}}));
    std::vector<PulledTensor> out;
    c.Wait(c.Pull({"w", "v"}, &out));
    ASSERT_EQ(out.size(), 2u);
    EXPECT_EQ(out[0].ToFloats()[255], 2.0f);
    EXPECT_EQ(out[1].ToFloats()[0], -1.0f);
  }

  std::string job_;
  JobConfig cfg_;
  std::unique_ptr<ServerProcess> s0_, s1_;
};

TEST_F(Curve, ClientWithTheKeysIsServedOnBothShards) {
  RoundTrip(cfg_);
  // Shard 1 reached the coordinator over CURVE too.
  EXPECT_TRUE(s0_->WaitForLog("server shard 1 joined", 3000)) << s0_->log();
}

TEST_F(Curve, PlaintextClientIsRefused) {
  JobConfig plain = cfg_;
  plain.curve_server_public.clear();
  plain.curve_client_public.clear();
  plain.curve_client_secret.clear();
  try {
    RoundTrip(plain, 1500);
    FAIL() << "a plaintext client was served";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("did not answer"), std::string::npos) << e.what();
  }
  // Depending on who notices first, ZeroMQ reports a mechanism mismatch or a cut handshake.
  EXPECT_TRUE(s0_->WaitForLog("rejected a connection on tcp://127.0.0.1:", 3000)) << s0_->log();
}

TEST_F(Curve, ClientWithAnotherKeyPairIsRefused) {
  JobConfig other = cfg_;
  auto kp = CurveKeyPair();
  other.curve_client_public = kp.first;
  other.curve_client_secret = kp.second;
  // The client's error says its handshake was refused, not that nobody is there.
  auto refused = [&](const JobConfig& job) {
    try {
      RoundTrip(job, 1500);
      return std::string("served");
    } catch (const Error& e) {
      return std::string(e.what());
    }
  };
  std::string e = refused(other);
  EXPECT_NE(e.find("did not answer"), std::string::npos) << e;
  EXPECT_NE(e.find("[security] keys"), std::string::npos) << e;
  EXPECT_TRUE(s0_->WaitForLog("refused CURVE client at 127.0.0.1: public key " + kp.first, 3000)) << s0_->log();
  // A worker of another job: other server keys as well.
  other.curve_server_public = CurveKeyPair().first;
  e = refused(other);
  EXPECT_NE(e.find("[security] keys"), std::string::npos) << e;
  RoundTrip(cfg_);  // and the rightful client is still served
}

}  // namespace
}  // namespace shoal
