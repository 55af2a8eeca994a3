#include "algorithms/live_quorum.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <thread>

#include "algorithms/collectives/factory.h"
#include "common/error.h"
#include "common/int_list.h"
#include "common/metrics.h"
#include "common/rendezvous/rendezvous.h"

namespace shoal {
namespace {

using Clock = std::chrono::steady_clock;
constexpr auto kPoll = std::chrono::milliseconds(10);

bool Contains(const std::vector<int>& v, int x) { return std::find(v.begin(), v.end(), x) != v.end(); }

std::vector<std::string> Split(const std::string& s, char sep) {
  std::vector<std::string> out(1);
  for (char c : s) {
    if (c == sep)
      out.emplace_back();
    else
      out.back() += c;
  }
  return out;
}

int64_t ParseRound(const std::string& s, const std::string& what) {
  std::vector<int64_t> v = ParseIntList<int64_t>(s, what);
  SHOAL_CHECK(v.size() == 1 && v[0] >= 0, what + ": \"" + s + "\" is no round number");
  return v[0];
}

}  // namespace

LiveQuorum::LiveQuorum(const AlgorithmEnv& env, std::string name)
    : env_(env), name_(std::move(name)), timeout_ms_(CollectiveTimeoutMs(*env.config)) {
  SHOAL_CHECK(env_.store && env_.make_member_ring, name_ + ": a live quorum needs the job's store and member rings");
}

std::optional<std::string> LiveQuorum::Peek(const std::string& key) {
  try {
    return env_.store->Get(key, 0);
  } catch (const Error&) {  // not there yet, or the coordinator busy: asked again after kPoll
    return std::nullopt;
  }
}

std::optional<LiveQuorum::Decision> LiveQuorum::ReadDecision() {
  std::optional<std::string> v = Peek(name_ + ".decision");
  if (!v) return std::nullopt;
  const std::string what = "store value " + name_ + ".decision";
  std::vector<std::string> f = Split(*v, ';');
  Decision d;
  d.round = ParseRound(f[0], what);
  if (f.size() == 2 && f[1] == "over") {
    d.over = true;
    return d;
  }
  SHOAL_CHECK(f.size() == 4, what + ": \"" + *v + "\" is no decision");
  d.ring = ParseRound(f[1], what);
  d.members = ParseIntList<int>(f[2], what);
  d.joiners = ParseIntList<int>(f[3], what);
  return d;
}

std::optional<LiveQuorum::Announcement> LiveQuorum::ReadAnnouncement(int rank) {
  std::optional<std::string> v = Peek(name_ + ".round." + std::to_string(rank));
  if (!v) return std::nullopt;
  std::vector<std::string> f = Split(*v, ';');
  const std::string what = "store value " + name_ + ".round." + std::to_string(rank);
  SHOAL_CHECK(f.size() == 2 && (f[1] == "v" || f[1] == "j"), what + ": \"" + *v + "\" is no announcement");
  return Announcement{ParseRound(f[0], what), f[1] == "j"};
}

void LiveQuorum::Announce(int64_t round, bool joiner) {
  env_.store->Set(name_ + ".round." + std::to_string(env_.rank), std::to_string(round) + (joiner ? ";j" : ";v"));
}

std::vector<int> LiveQuorum::DeadRanks() { return ParseIntList<int>(Peek(kDeadRanksKey).value_or(""), kDeadRanksKey); }

bool LiveQuorum::Gone(int rank, int64_t decided, const std::vector<int>& dead) {
  if (Contains(dead, rank)) return true;
  std::optional<Announcement> a = ReadAnnouncement(rank);
  return a && a->joiner && a->round > decided;
}

int LiveQuorum::LowestLive(const std::vector<int>& members, int64_t decided) {
  const std::vector<int> dead = DeadRanks();
  for (int r : members)  // sorted
    if (r == env_.rank || !Gone(r, decided, dead)) return r;
  return env_.rank;
}

std::string LiveQuorum::Claim(const std::string& key, int64_t round, const std::string& value) {
  std::string held = Peek(key).value_or("");
  // Each failed compare-and-set returns a newer value: at most one per decider of the round.
  while (held.empty() || ParseRound(Split(held, ';')[0], "store value " + key) < round)
    held = env_.store->CompareSet(key, held, value);
  return held;
}

LiveQuorum::Decision LiveQuorum::Decide(int64_t round, bool admit_joiners, int64_t step) {
  // The previous round's members are waited for; anyone else is taken only if already there.
  std::vector<int> expected;
  if (current_.round < 0) {
    for (int r = 0; r < env_.world; ++r)
      if (r != env_.rank) expected.push_back(r);
  } else {
    for (int r : current_.members)
      if (r != env_.rank) expected.push_back(r);
  }
  Decision d;
  d.round = round;
  d.members = {env_.rank};
  std::vector<int> pending = expected, dropped;
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms_);
  while (!pending.empty()) {
    const std::vector<int> dead = DeadRanks();
    std::vector<int> still;
    for (int r : pending) {
      std::optional<Announcement> a = ReadAnnouncement(r);
      if (a && a->joiner && a->round >= round) {  // restarted before its death was noticed: a newcomer
        if (a->round == round && admit_joiners) d.joiners.push_back(r);
        if (a->round != round || !admit_joiners) dropped.push_back(r);
      } else if (Contains(dead, r)) {  // a member that announced this round and then died, too
        dropped.push_back(r);
      } else if (a && a->round == round && !a->joiner) {
        d.members.push_back(r);
      } else {
        still.push_back(r);
      }
    }
    pending = still;
    if (pending.empty()) break;
    if (Clock::now() > deadline) {
      fprintf(stderr, "diloco: worker(s) %s silent for %d ms (collective_timeout_ms): left out of round %lld\n",
              JoinIntList(pending, ", ").c_str(), timeout_ms_, (long long)round);
      dropped.insert(dropped.end(), pending.begin(), pending.end());
      break;
    }
    std::this_thread::sleep_for(kPoll);
  }
  if (admit_joiners)
    for (int r = 0; r < env_.world; ++r) {
      if (r == env_.rank || Contains(expected, r)) continue;
      std::optional<Announcement> a = ReadAnnouncement(r);
      if (a && a->round == round && a->joiner) d.joiners.push_back(r);
    }
  d.members.insert(d.members.end(), d.joiners.begin(), d.joiners.end());
  std::sort(d.members.begin(), d.members.end());
  std::sort(d.joiners.begin(), d.joiners.end());
  // A newcomer is a new process even where its rank was a member: a new ring for it too.
  // After a failed round its ring is broken (aborted), members or not.
  d.ring = d.members == current_.members && d.joiners.empty() && !ring_broken_ ? current_.ring : current_.ring + 1;
  const std::string mine = std::to_string(d.round) + ";" + std::to_string(d.ring) + ";" + JoinIntList(d.members) + ";" +
                           JoinIntList(d.joiners);
  if (Claim(name_ + ".decision", round, mine) != mine) return Decision{};  // another decider was first
  decided_ = true;
  if (d.ring != current_.ring) {
    std::sort(dropped.begin(), dropped.end());
    printf("diloco: round %lld among workers %s%s%s (decided by worker %d)\n", (long long)round,
           JoinIntList(d.members, ", ").c_str(),
           dropped.empty() ? "" : ("; left out: " + JoinIntList(dropped, ", ")).c_str(),
           d.joiners.empty() ? "" : ("; joining: " + JoinIntList(d.joiners, ", ")).c_str(), env_.rank);
    fflush(stdout);
    if (env_.metrics)
      env_.metrics->Write("quorum", step,
                          JsonObject()
                              .Add("round", round)
                              .Add("members", JoinIntList(d.members))
                              .Add("left_out", JoinIntList(dropped))
                              .Add("joiners", JoinIntList(d.joiners))
                              .Add("decider", env_.rank));
  }
  return d;
}

Communicator& LiveQuorum::Adopt(const Decision& d) {
  if (!ring_ || d.ring != current_.ring) {
    if (ring_) bytes_before_ += ring_->bytes_sent();
    ring_.reset();    // its neighbours may be gone; nothing is in flight after a whole collective
    if (!decided_) {  // the decider said so as it decided
      printf("worker %d: outer round %lld among workers %s%s\n", env_.rank, (long long)d.round,
             JoinIntList(d.members, ", ").c_str(),
             d.joiners.empty() ? "" : (" (joining: " + JoinIntList(d.joiners, ", ") + ")").c_str());
      fflush(stdout);
    }
    ring_ = env_.make_member_ring(name_ + "-" + std::to_string(d.ring), d.members);
  }
  decided_ = false;
  current_ = d;
  return *ring_;
}

Communicator& LiveQuorum::Enter(bool admit_joiners, int64_t step) {
  const int64_t round = current_.round + 1;
  Announce(round, false);
  std::vector<int> candidates = current_.members;
  if (current_.round < 0)
    for (int r = 0; r < env_.world; ++r) candidates.push_back(r);
  // The decider may wait collective_timeout_ms for a silent member; a decider that died is
  // listed dead within heartbeat_timeout_ms, and the next one waits afresh.
  int decider = LowestLive(candidates, current_.round);
  auto deadline = Clock::now() + 2 * std::chrono::milliseconds(timeout_ms_);
  while (true) {
    std::optional<Decision> d = ReadDecision();
    if (d && d->round >= round) {
      if (d->over || d->round > round || !Contains(d->members, env_.rank))
        throw Error("diloco: worker " + std::to_string(env_.rank) + " was left out of outer round " +
                    std::to_string(round) + " (worker " + std::to_string(decider) +
                    " decided it without hearing from this one within collective_timeout_ms " +
                    std::to_string(timeout_ms_) + "); it stops so that it can be started again and rejoin");
      return Adopt(*d);
    }
    const int now = LowestLive(candidates, current_.round);
    if (now != decider) {
      decider = now;
      deadline = Clock::now() + 2 * std::chrono::milliseconds(timeout_ms_);
    }
    if (decider == env_.rank) {
      Decision mine = Decide(round, admit_joiners, step);
      if (mine.round == round) return Adopt(mine);
      continue;  // another decider won: read its decision
    }
    if (Clock::now() > deadline)
      throw Error("diloco: worker " + std::to_string(env_.rank) + ": no decision on outer round " +
                  std::to_string(round) + " from worker " + std::to_string(decider) + " within " +
                  std::to_string(2 * timeout_ms_) + " ms");
    std::this_thread::sleep_for(kPoll);
  }
}

Communicator& LiveQuorum::EnterAsJoiner() {
  // The round after the newest decided one, again after every decision that did not take it.
  // The round that takes it cannot be passed unseen: its ring waits for this worker.
  int64_t seen = -2, announced = -2;
  auto progress = Clock::now();
  while (true) {
    std::optional<Decision> d = ReadDecision();
    if (d && d->over)
      throw Error("diloco: worker " + std::to_string(env_.rank) + ": the job ended before it could rejoin");
    const int64_t decided = d ? d->round : -1;
    if (d && decided == announced && Contains(d->joiners, env_.rank)) return Adopt(*d);
    if (decided != seen) {
      seen = decided;
      progress = Clock::now();
      announced = decided + 1;
      Announce(announced, true);
    }
    if (Clock::now() - progress > std::chrono::milliseconds(timeout_ms_))
      throw Error("diloco: worker " + std::to_string(env_.rank) + ": no outer round decided for " +
                  std::to_string(timeout_ms_) + " ms (collective_timeout_ms) while it waited to rejoin");
    std::this_thread::sleep_for(kPoll);
  }
}

bool LiveQuorum::Commits(int64_t round, bool completed) {
  std::vector<int> pending, failed;
  for (int r : current_.members)
    if (r != env_.rank) pending.push_back(r);
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms_);
  while (!pending.empty()) {
    const std::vector<int> dead = DeadRanks();
    std::vector<int> still;
    for (int r : pending) {
      std::optional<std::string> v = Peek(name_ + ".done." + std::to_string(r));
      std::vector<std::string> f = v ? Split(*v, ';') : std::vector<std::string>();
      if (f.size() == 2 && f[0] == std::to_string(round)) {
        if (f[1] != "ok") failed.push_back(r);
      } else if (Gone(r, round, dead) || Clock::now() > deadline) {
        failed.push_back(r);  // gone: dead, restarted (a newcomer now) or silent
      } else {
        still.push_back(r);
      }
    }
    pending = still;
    if (!pending.empty()) std::this_thread::sleep_for(kPoll);
  }
  return completed && failed.empty();
}

bool LiveQuorum::Settle(bool completed) {
  const int64_t round = current_.round;
  const std::string outcome_key = name_ + ".outcome";
  env_.store->Set(name_ + ".done." + std::to_string(env_.rank), std::to_string(round) + (completed ? ";ok" : ";fail"));
  int decider = -1;
  auto deadline = Clock::now();
  std::string outcome;
  while (true) {
    std::optional<std::string> v = Peek(outcome_key);
    if (v && ParseRound(Split(*v, ';')[0], "store value " + outcome_key) >= round) {
      outcome = *v;
      break;
    }
    const int now = LowestLive(current_.members, round);
    if (now != decider) {
      decider = now;
      deadline = Clock::now() + 2 * std::chrono::milliseconds(timeout_ms_);
    }
    if (decider == env_.rank) {
      outcome = Claim(outcome_key, round, std::to_string(round) + (Commits(round, completed) ? ";commit" : ";retry"));
      break;
    }
    if (Clock::now() > deadline)
      throw Error("diloco: worker " + std::to_string(env_.rank) + ": no outcome of outer round " +
                  std::to_string(round) + " from worker " + std::to_string(decider) + " within " +
                  std::to_string(2 * timeout_ms_) + " ms");
    std::this_thread::sleep_for(kPoll);
  }
  const bool commit = outcome == std::to_string(round) + ";commit";
  if (!commit) {
    ring_broken_ = true;
    fprintf(stderr, "worker %d: outer round %lld did not complete on every member; again among the live workers\n",
            env_.rank, (long long)round);
  }
  return commit;
}

void LiveQuorum::End() {
  const int64_t round = current_.round + 1;
  Claim(name_ + ".decision", round, std::to_string(round) + ";over");
}

int LiveQuorum::StateRoot() const {
  for (size_t i = 0; i < current_.members.size(); ++i)
    if (!Contains(current_.joiners, current_.members[i])) return int(i);
  throw Error("diloco: round " + std::to_string(current_.round) + " has no member that is not a newcomer");
}

}  // namespace shoal
