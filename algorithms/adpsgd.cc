// "adpsgd" (Lian et al. 2018, seed 003): asynchronous decentralized SGD. No barrier per
// step: after each local gradient step an active worker (even rank) averages its model
// with one randomly chosen passive worker (odd rank) directly over ZeroMQ; passive
// workers answer from a background thread over the job's Transport (CurveZMQ and
// the client-key check like every other socket). Actives only ask and passives only answer, so
// averaging can never deadlock (the paper's bipartite scheme), and each exchange sets both
// models to their mean, preserving their sum. At the end the workers average once over
// the ring so the job ends with one model.
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <mutex>
#include <random>
#include <sstream>
#include <thread>

#include "algorithms/algorithm.h"
#include "common/rendezvous/store.h"
#include "common/error.h"
#include "common/rate_limiter.h"
#include "common/transport/transport.h"

namespace shoal {
namespace {

CurveKeys KeysOf(const JobConfig& c) {
  return CurveKeys{c.curve_server_public, c.curve_server_secret, c.curve_client_public, c.curve_client_secret};
}

// A gossip message: kind, request id, and (for gossip and its reply) the model as one
// fp32 tensor named "model", sent from `data` in place (kept alive by `keep`).
void FillGossip(OutMessage* m, msg::Kind kind, uint64_t id, int rank, std::shared_ptr<std::vector<float>> model) {
  auto h = m->header();
  h.setKind(kind);
  h.setRequestId(id);
  h.setRank(rank);
  if (!model) return;
  auto t = h.initTensors(1);
  t[0].setName("model");
  t[0].setDtype(msg::DType::FP32);
  t[0].initShape(1).set(0, int64_t(model->size()));
  t[0].setByteSize(model->size() * 4);
  Payload p;
  p.data = model->data();
  p.size = model->size() * 4;
  p.keep = model;
  m->payloads.push_back(std::move(p));
}

// The model a gossip message carries, or nullptr when it is not `floats` fp32 values.
const float* ModelOf(InMessage& m, int64_t floats) {
  m.ValidateTensors();
  auto metas = m.header().getTensors();
  if (metas.size() != 1 || metas[0].getDtype() != msg::DType::FP32 || m.payloads[0].size() != size_t(floats) * 4)
    return nullptr;
  return static_cast<const float*>(m.payloads[0].data());
}

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
    StartFromRankZero(*comm_, params);
    total_ = 0;
    for (auto& p : params) total_ += p.n;
    model_.resize(size_t(total_));
    Gather(params, model_.data());
    SHOAL_CHECK(env_.store, "adpsgd: the environment has no rendezvous store");
    Store& store = *env_.store;
    const CurveKeys keys = KeysOf(*env_.config);
    if (passive()) {
      router_ = std::make_unique<Transport>(ctx_, Transport::Kind::kServer, keys);
      router_->SetMaxMessageBytes(int64_t(total_) * 4 + 4096);  // a model's worth and its header, no more
      const std::string& host = env_.config->workers[size_t(env_.rank)].host;  // may be a name: see ZmqRing::Wire
      std::string ep = ReachableEndpoint(host, router_->Bind(ListenEndpoint(host + ":*")));
      store.Set("adpsgd-" + std::to_string(env_.rank), ep);
      responder_ = std::thread([this] { Respond(); });
    }
    comm_->Barrier();  // every passive is listening
    if (!passive()) {
      for (int r = 1; r < env_.world; r += 2) {
        auto t = std::make_unique<Transport>(ctx_, Transport::Kind::kClient, keys);
        t->Connect(store.Get("adpsgd-" + std::to_string(r), 60000));
        peers_.push_back({r, std::move(t), true});
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
        OutMessage bye;
        FillGossip(&bye, msg::Kind::GOSSIP_BYE, 0, env_.rank, nullptr);
        p.link->TrySend(bye);
      }
    comm_->Barrier();  // every active has said goodbye, every passive has heard it
    StopResponder();
    {
      std::lock_guard<std::mutex> lock(mu_);
      Scatter(model_.data(), params);
    }
    for (auto& p : params) comm_->AllReduce(p.w, p.n, ReduceOp::kMean);
    peers_.clear();
  }
  bool ModelChangedAtFinish() const override { return true; }

  bool AgreeToStop(bool mine) override { return AnyRank(*comm_, mine); }
  int64_t skipped_steps() const override { return updater_.skipped(); }
  Communicator* peers() override { return comm_.get(); }
  // Each worker's own model: a job on another number of workers starts from their mean.
  std::vector<std::string> AveragedOnReshape() const override { return {"w/", "adpsgd/model"}; }
  std::string ReshapeNote() const override { return "the model is the mean of the workers that hold it"; }
  int64_t bytes_sent() const override { return comm_->bytes_sent() + gossip_bytes_.load(); }
  // Each worker its own model (with the averages peers made into it), its optimizer and
  // its choice of peers.
  void SaveState(const std::vector<ParamView>& params, CheckpointState* out) override {
    updater_.Save(params, "opt/", out);
    std::ostringstream rng;
    rng << rng_;
    out->Put("adpsgd/rng", rng.str());
    std::lock_guard<std::mutex> lock(mu_);
    out->PutFloats("adpsgd/model", model_);
  }
  void LoadState(const std::vector<ParamView>& params, const CheckpointState& in) override {
    updater_.Load(params, "opt/", in);
    std::istringstream rng(in.Get("adpsgd/rng"));
    rng >> rng_;
    SHOAL_CHECK(!rng.fail(), "checkpoint: entry 'adpsgd/rng' is not a random stream state");
    // Another set of workers got one worker's stream: each draws its own peers again.
    if (in.record.shards != uint32_t(env_.world))
      rng_.seed(env_.config->seed * 31 + uint64_t(env_.rank) + uint64_t(in.record.step) * 1000003);
    std::lock_guard<std::mutex> lock(mu_);
    model_ = in.GetFloatVector("adpsgd/model", size_t(total_));
    Scatter(model_.data(), params);
  }
  void AddMetrics(JsonObject* out) const override {
    out->Add("consensus_distance", consensus_n_ ? consensus_sum_ / double(consensus_n_) : 0.0);
    out->Add("averagings", averagings_.load());
    consensus_sum_ = 0;
    consensus_n_ = 0;
  }

 private:
  struct Peer {
    int rank;
    std::unique_ptr<Transport> link;
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
    auto mine = std::make_shared<std::vector<float>>();
    {
      std::lock_guard<std::mutex> lock(mu_);
      *mine = model_;
    }
    const uint64_t id = ++next_request_;
    OutMessage out;
    FillGossip(&out, msg::Kind::GOSSIP, id, env_.rank, mine);
    limiter_.Acquire(double(mine->size() * 4));
    peer->link->Send(out);
    gossip_bytes_ += int64_t(mine->size() * 4);
    InMessage m;
    auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms_);
    while (true) {  // skip a late answer to an earlier, timed-out request
      int left = int(
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()).count());
      if (left <= 0 || !peer->link->Recv(&m, left)) {
        // A passive that stopped answering is dropped from the pairing; training goes on.
        // One that refused our handshake (another job's keys) is named as such.
        fprintf(stderr, "adpsgd: rank %d did not answer within %d ms%s; averaging without it from now on\n", peer->rank,
                timeout_ms_, peer->link->RefusalHint().c_str());
        peer->alive = false;
        return;
      }
      if (m.header().getRequestId() == id) break;
    }
    const float* theirs = m.header().getKind() == msg::Kind::GOSSIP_REPLY ? ModelOf(m, total_) : nullptr;
    if (!theirs) throw Error("adpsgd: malformed reply from rank " + std::to_string(peer->rank));
    std::lock_guard<std::mutex> lock(mu_);
    double d2 = 0;
    // Only the average of what we sent and what they had moves our model: our own
    // updates since sending are kept (model_ - mine is added back).
    for (int64_t i = 0; i < total_; ++i) {
      float sent = (*mine)[size_t(i)];
      float avg = 0.5f * (sent + theirs[i]);
      double d = double(sent) - theirs[i];
      d2 += d * d;
      model_[size_t(i)] += avg - sent;
    }
    consensus_sum_ += std::sqrt(d2);
    ++consensus_n_;
    ++averagings_;
  }

  // Passive side: answer each request with our model and take the mean. Anything else on
  // the port is dropped with one line (a few, then every thousandth), never fatal.
  void Respond() {
    while (!stop_.load()) {
      InMessage m;
      std::string bad;
      try {
        router_->DrainEvents();  // refused handshakes go to the refusal log
        if (!router_->Recv(&m, 50)) continue;
        auto kind = m.header().getKind();
        if (kind == msg::Kind::GOSSIP_BYE) continue;
        const float* theirs = kind == msg::Kind::GOSSIP ? ModelOf(m, total_) : nullptr;
        if (!theirs) {
          bad = "a gossip message of the wrong kind or size";
        } else {
          auto reply = std::make_shared<std::vector<float>>();
          {
            std::lock_guard<std::mutex> lock(mu_);
            *reply = model_;
            for (int64_t i = 0; i < total_; ++i) model_[size_t(i)] = 0.5f * (model_[size_t(i)] + theirs[i]);
            ++averagings_;
          }
          OutMessage out;
          FillGossip(&out, msg::Kind::GOSSIP_REPLY, m.header().getRequestId(), env_.rank, reply);
          limiter_.Acquire(double(reply->size() * 4));
          router_->Send(out, &m.identity);
          gossip_bytes_ += int64_t(reply->size() * 4);
        }
      } catch (const std::exception& e) {  // BadMessage, Error
        bad = e.what();
      } catch (...) {
        bad = "an undecodable message";
      }
      if (!bad.empty() && (dropped_++ < 3 || dropped_ % 1000 == 0))
        fprintf(stderr, "adpsgd rank %d: dropped a malformed gossip message (%s; %lld so far)\n", env_.rank,
                bad.c_str(), (long long)dropped_);
    }
  }

  void StopResponder() {
    stop_ = true;
    if (responder_.joinable()) responder_.join();
    router_.reset();
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
  TransportContext ctx_{"adpsgd"};
  std::unique_ptr<Transport> router_;
  std::vector<Peer> peers_;
  uint64_t next_request_ = 0;
  int64_t dropped_ = 0;
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
