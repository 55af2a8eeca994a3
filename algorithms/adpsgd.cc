// "adpsgd" (Lian et al. 2018, seed 003): asynchronous decentralized SGD. No barrier per
// step: after each local gradient step an active worker (even rank) averages its model
// with one randomly chosen passive worker (odd rank) directly over ZeroMQ; passive
// workers answer from a background thread. Actives only ask and passives only answer, so
// averaging can never deadlock (the paper's bipartite scheme), and each exchange sets both
// models to their mean, preserving their sum. At the end the workers average once over
// the ring so the job ends with one model.
#include <zmq.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <mutex>
#include <random>
#include <thread>

#include "algorithms/algorithm.h"
#include "algorithms/collectives/store.h"
#include "common/error.h"
#include "common/rate_limiter.h"

namespace shoal {
namespace {

constexpr uint32_t kMagic = 0x53484750;  // "SHGP"
enum Kind : uint32_t { kAverage = 1, kBye = 2 };
struct GossipHeader {
  uint32_t magic;
  uint32_t kind;
  uint64_t floats;
};

class AdPsgd : public Algorithm {
 public:
  explicit AdPsgd(const AlgorithmEnv& env)
      : env_(env),
        updater_(env),
        rng_(env.config->seed * 31 + uint64_t(env.rank)),
        limiter_(env.config->workers[size_t(env.rank)].bandwidth_mbps * 1e6 / 8) {
    timeout_ms_ = int(env.config->algorithm_opts.GetInt("gossip_timeout_ms", 10000, 10, 3600000));
    comm_ = env.make_communicator("adpsgd");  // start/stop agreement and the final average
  }
  ~AdPsgd() override { StopResponder(); }
  std::string Name() const override { return "adpsgd"; }

  void Init(const std::vector<ParamView>& params) override {
    for (auto& p : params) comm_->Broadcast(p.w, p.n * 4, 0);
    total_ = 0;
    for (auto& p : params) total_ += p.n;
    model_.resize(size_t(total_));
    Gather(params, model_.data());
    ctx_ = zmq_ctx_new();
    SHOAL_CHECK(env_.store, "adpsgd: the environment has no rendezvous store");
    Store& store = *env_.store;
    if (passive()) {
      router_ = zmq_socket(ctx_, ZMQ_ROUTER);
      int linger = 1000;
      zmq_setsockopt(router_, ZMQ_LINGER, &linger, sizeof linger);
      int64_t maxmsg = int64_t(total_) * 4 + 64;  // a model's worth, no more
      zmq_setsockopt(router_, ZMQ_MAXMSGSIZE, &maxmsg, sizeof maxmsg);
      const JobConfig& c = *env_.config;
      if (c.curve_enabled()) {  // gossip is encrypted like every other link of the job
        int one = 1;
        zmq_setsockopt(router_, ZMQ_CURVE_SERVER, &one, sizeof one);
        zmq_setsockopt(router_, ZMQ_CURVE_SECRETKEY, c.curve_server_secret.c_str(), 40);
      }
      std::string bind = "tcp://" + env_.config->workers[size_t(env_.rank)].host + ":*";
      if (zmq_bind(router_, bind.c_str()) != 0) throw Error("adpsgd: bind " + bind + ": " + zmq_strerror(zmq_errno()));
      char ep[256];
      size_t len = sizeof ep;
      zmq_getsockopt(router_, ZMQ_LAST_ENDPOINT, ep, &len);
      store.Set("adpsgd-" + std::to_string(env_.rank), ep);
      responder_ = std::thread([this] { Respond(); });
    }
    comm_->Barrier();  // every passive is listening
    if (!passive()) {
      for (int r = 1; r < env_.world; r += 2) {
        void* s = zmq_socket(ctx_, ZMQ_DEALER);
        int linger = 0;
        zmq_setsockopt(s, ZMQ_LINGER, &linger, sizeof linger);
        const JobConfig& c = *env_.config;
        if (c.curve_enabled()) {
          zmq_setsockopt(s, ZMQ_CURVE_SERVERKEY, c.curve_server_public.c_str(), 40);
          zmq_setsockopt(s, ZMQ_CURVE_PUBLICKEY, c.curve_client_public.c_str(), 40);
          zmq_setsockopt(s, ZMQ_CURVE_SECRETKEY, c.curve_client_secret.c_str(), 40);
        }
        std::string ep = store.Get("adpsgd-" + std::to_string(r), 60000);
        if (zmq_connect(s, ep.c_str()) != 0) throw Error("adpsgd: connect to rank " + std::to_string(r) + " at " + ep);
        peers_.push_back({r, s, true});
      }
    }
  }

  void Step(const std::vector<ParamView>& params, const StepInfo& info) override {
    {
      // The gradient (computed on the model as it was) lands on the model as it is now,
      // including averages a peer made meanwhile.
      std::lock_guard<std::mutex> lock(mu_);
      Scatter(model_.data(), params);
      updater_.Apply(params, info.step);
      Gather(params, model_.data());
    }
    if (!passive()) AverageWithRandomPeer();
    std::lock_guard<std::mutex> lock(mu_);
    Scatter(model_.data(), params);
  }

  void Finish(const std::vector<ParamView>& params) override {
    if (!passive())
      for (auto& p : peers_) {
        GossipHeader h{kMagic, kBye, 0};
        zmq_send(p.sock, &h, sizeof h, ZMQ_DONTWAIT);
      }
    comm_->Barrier();  // every active has said goodbye, every passive has heard it
    StopResponder();
    {
      std::lock_guard<std::mutex> lock(mu_);
      Scatter(model_.data(), params);
    }
    for (auto& p : params) comm_->AllReduce(p.w, p.n, ReduceOp::kMean);
    for (auto& p : peers_) zmq_close(p.sock);
    peers_.clear();
    if (ctx_) {
      zmq_ctx_term(ctx_);
      ctx_ = nullptr;
    }
  }
  bool ModelChangedAtFinish() const override { return true; }

  bool AgreeToStop(bool mine) override {
    float v = mine ? 1.f : 0.f;
    comm_->AllReduce(&v, 1, ReduceOp::kSum);
    return v > 0;
  }
  int64_t bytes_sent() const override { return comm_->bytes_sent() + gossip_bytes_.load(); }
  void AddMetrics(JsonObject* out) const override {
    out->Add("consensus_distance", consensus_n_ ? consensus_sum_ / double(consensus_n_) : 0.0);
    out->Add("averagings", averagings_.load());
    consensus_sum_ = 0;
    consensus_n_ = 0;
  }

 private:
  struct Peer {
    int rank;
    void* sock;
    bool alive;
  };
  bool passive() const { return env_.rank % 2 == 1; }

  static void Gather(const std::vector<ParamView>& params, float* out) {
    for (auto& p : params) {
      memcpy(out, p.w, size_t(p.n) * 4);
      out += p.n;
    }
  }
  static void Scatter(const float* in, const std::vector<ParamView>& params) {
    for (auto& p : params) {
      memcpy(p.w, in, size_t(p.n) * 4);
      in += p.n;
    }
  }

  void AverageWithRandomPeer() {
    std::vector<Peer*> alive;
    for (auto& p : peers_)
      if (p.alive) alive.push_back(&p);
    if (alive.empty()) return;
    Peer* peer = alive[std::uniform_int_distribution<size_t>(0, alive.size() - 1)(rng_)];
    std::vector<float> mine;
    {
      std::lock_guard<std::mutex> lock(mu_);
      mine = model_;
    }
    GossipHeader h{kMagic, kAverage, uint64_t(total_)};
    limiter_.Acquire(double(sizeof h + mine.size() * 4));
    zmq_send(peer->sock, &h, sizeof h, ZMQ_SNDMORE);
    zmq_send(peer->sock, mine.data(), mine.size() * 4, 0);
    gossip_bytes_ += int64_t(sizeof h + mine.size() * 4);
    zmq_pollitem_t item{peer->sock, 0, ZMQ_POLLIN, 0};
    if (zmq_poll(&item, 1, timeout_ms_) <= 0) {
      // A passive that stopped answering is dropped from the pairing; training goes on.
      fprintf(stderr, "adpsgd: rank %d did not answer within %d ms; averaging without it from now on\n", peer->rank,
              timeout_ms_);
      peer->alive = false;
      return;
    }
    zmq_msg_t m;
    zmq_msg_init(&m);
    zmq_msg_recv(&m, peer->sock, 0);
    bool ok = zmq_msg_size(&m) == size_t(total_) * 4;
    if (ok) {
      const float* theirs = static_cast<const float*>(zmq_msg_data(&m));
      std::lock_guard<std::mutex> lock(mu_);
      double d2 = 0;
      // Only the average of what we sent and what they had moves our model: our own
      // updates since sending are kept (model_ - mine is added back).
      for (int64_t i = 0; i < total_; ++i) {
        float avg = 0.5f * (mine[size_t(i)] + theirs[i]);
        double d = double(mine[size_t(i)]) - theirs[i];
        d2 += d * d;
        model_[size_t(i)] += avg - mine[size_t(i)];
      }
      consensus_sum_ += std::sqrt(d2);
      ++consensus_n_;
      ++averagings_;
    }
    zmq_msg_close(&m);
    if (!ok) throw Error("adpsgd: malformed reply from rank " + std::to_string(peer->rank));
  }

  // Passive side: answer each request with our model and take the mean.
  void Respond() {
    std::vector<zmq_msg_t> parts;
    while (!stop_.load()) {
      zmq_pollitem_t item{router_, 0, ZMQ_POLLIN, 0};
      if (zmq_poll(&item, 1, 50) <= 0) continue;
      // [identity][header][payload?]
      std::vector<std::string> frames;
      int more = 1;
      while (more) {
        zmq_msg_t m;
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, router_, 0) < 0) {
          zmq_msg_close(&m);
          break;
        }
        frames.emplace_back(static_cast<const char*>(zmq_msg_data(&m)), zmq_msg_size(&m));
        zmq_msg_close(&m);
        size_t ml = sizeof more;
        zmq_getsockopt(router_, ZMQ_RCVMORE, &more, &ml);
      }
      GossipHeader h{};
      if (frames.size() < 2 || frames[1].size() != sizeof h) {
        fprintf(stderr, "adpsgd rank %d: dropped a malformed gossip message (%zu frames)\n", env_.rank, frames.size());
        continue;
      }
      memcpy(&h, frames[1].data(), sizeof h);
      if (h.magic != kMagic) {
        fprintf(stderr, "adpsgd rank %d: dropped a gossip message with a bad header\n", env_.rank);
        continue;
      }
      if (h.kind == kBye) continue;
      if (h.kind != kAverage || frames.size() != 3 || h.floats != uint64_t(total_) ||
          frames[2].size() != size_t(total_) * 4) {
        fprintf(stderr, "adpsgd rank %d: dropped a gossip message of the wrong size\n", env_.rank);
        continue;
      }
      const float* theirs = reinterpret_cast<const float*>(frames[2].data());
      std::vector<float> reply;
      {
        std::lock_guard<std::mutex> lock(mu_);
        reply = model_;
        for (int64_t i = 0; i < total_; ++i) model_[size_t(i)] = 0.5f * (model_[size_t(i)] + theirs[i]);
        ++averagings_;
      }
      limiter_.Acquire(double(reply.size() * 4));
      zmq_send(router_, frames[0].data(), frames[0].size(), ZMQ_SNDMORE);
      zmq_send(router_, reply.data(), reply.size() * 4, 0);
      gossip_bytes_ += int64_t(reply.size() * 4);
    }
  }

  void StopResponder() {
    stop_ = true;
    if (responder_.joinable()) responder_.join();
    if (router_) {
      zmq_close(router_);
      router_ = nullptr;
    }
  }

  AlgorithmEnv env_;
  LocalUpdater updater_;
  std::unique_ptr<Communicator> comm_;
  std::mt19937_64 rng_;
  RateLimiter limiter_;
  int timeout_ms_;
  int64_t total_ = 0;
  std::mutex mu_;
  std::vector<float> model_;  // this worker's model; the responder averages into it
  void* ctx_ = nullptr;
  void* router_ = nullptr;
  std::vector<Peer> peers_;
  std::thread responder_;
  std::atomic<bool> stop_{false};
  std::atomic<int64_t> gossip_bytes_{0};
  std::atomic<int64_t> averagings_{0};
  mutable double consensus_sum_ = 0;
  mutable int64_t consensus_n_ = 0;
};

const bool kRegistered =
    RegisterAlgorithm("adpsgd", [](const AlgorithmEnv& env) { return std::unique_ptr<Algorithm>(new AdPsgd(env)); });

}  // namespace
}  // namespace shoal
