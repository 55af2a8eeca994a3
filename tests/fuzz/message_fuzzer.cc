// Fuzzes what a parameter-server shard does with messages off the wire: the frame
// decoder (InMessage::Decode, ending in InMessage::Accept, the decoder Transport::Recv
// uses), the header validator, and shard 0's handling (coordinator, KV store, update rule) through Server::Serve, the
// same call Server::Run makes per message. Each input is a sequence of messages to one fresh shard, so stateful paths
// (register, then push, then pull) are reachable:
//   repeat { u8 frames (low 3 bits), u16 header_len, u16 frame_len[frames], header, frames }
// Rejections (BadMessage, an ERROR reply) are the normal outcome; a crash, a sanitizer
// report, a hang or a huge allocation is a finding.
#include <glog/logging.h>

#include <atomic>
#include <vector>

#include "common/config.h"
#include "common/error.h"
#include "common/transport/transport.h"
#include "server/aggregation.h"
#include "server/server.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

const char kJob[] = R"(
[job]
name = "fuzz"
[cluster]
servers = ["127.0.0.1:7701", "127.0.0.1:7702"]
workers = 2
[security]
allow_plaintext = true
[data]
format = "synthetic"
[optimizer]
name = "lamb"
lr = 0.1
weight_decay = 1e-4
)";

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  FLAGS_minloglevel = 3;  // the shard logs every rejection; the fuzzer needs none of it
  google::InitGoogleLogging("message_fuzzer");
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const shoal::JobConfig cfg = shoal::ParseJobConfig(kJob, "fuzz.toml");
  shoal::Server server(cfg, 0, "inproc://shoal-fuzz-shard0");
  server.kv().SetUpdateRule(shoal::MakeServerUpdateRule(cfg));
  shoal::fuzz::Reader in{data, size};
  shoal::InMessage m;  // reused for every message, as Server::Run does
  m.align_payloads = false;
  for (int msgs = 0; in.n > 0 && msgs < 16; ++msgs) {
    size_t nframes = in.U8() & 7;
    size_t header_len = in.U16();
    std::vector<size_t> lens;
    for (size_t i = 0; i < nframes; ++i) lens.push_back(in.U16());
    std::vector<shoal::Frame> frames;
    frames.emplace_back("peer", 4);  // the ROUTER identity
    const uint8_t* at = in.p;
    frames.emplace_back(at, in.Take(header_len));
    for (size_t len : lens) {
      at = in.p;
      frames.emplace_back(at, in.Take(len));
    }
    try {
      m.Decode(std::move(frames), /*with_identity=*/true);
    } catch (const shoal::BadMessage&) {
      continue;
    }
    server.Serve(m);
  }
  return 0;
}
