// Who takes part in each collective of a job that survives lost workers (diloco with
// [algorithm] elastic = true), agreed per round as torchft's per-step quorum does, over the
// job's rendezvous store. Every member announces each round (`<name>.round.<rank>` =
// "<round>;v", or ";j" for a worker restarted alone). The round's decider is the lowest
// member of the previous round that is not gone (listed dead by the coordinator, kDeadRanksKey,
// or announcing itself as a newcomer: restarted); when it goes, the next lowest takes over,
// so any worker, rank 0 included, can be lost. It waits for the previous round's members that
// announced, less those gone or silent past collective_timeout_ms, adds the newcomers where the
// round admits them, and claims `<name>.decision` = "<round>;<ring>;<members>;<joiners>" (rank
// lists) with a compare-and-set from the previous round's value (Store::CompareSet), so two
// deciders of one round can never both win: the loser adopts the winner's decision. Every
// member builds a ring among the members (MakeMemberRing, store prefix `<name>-<ring>`)
// whenever they change. After the round's collective every member reports whether it completed
// (`<name>.done.<rank>`), and the round's lowest live member claims `<name>.outcome` =
// "<round>;commit" only when all did: a member that died in the collective (some others may
// have finished it) makes every member do the round again among those left, so no member ever
// applies a result the others did not. Not thread-safe: the trainer's thread only.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "algorithms/algorithm.h"

namespace shoal {

class LiveQuorum {
 public:
  LiveQuorum(const AlgorithmEnv& env, std::string name);
  // This member's next round: waits for the decision (or makes it, as the decider), bounded,
  // and returns the ring among its members. Throws when this worker was left out (slower than
  // collective_timeout_ms: the launcher restarts it, and it joins again). `step`: the
  // trainer's, for the decider's `quorum` event when the members change.
  Communicator& Enter(bool admit_joiners, int64_t step);
  // A worker restarted alone: announces itself until a round that admits newcomers takes it
  // (bounded: collective_timeout_ms without any round decided); throws once the job ended.
  Communicator& EnterAsJoiner();
  // After the round's collective (`completed`: it returned on this member): true when it did
  // on every member, so its result may be used; false when some member failed or died in it,
  // and the work is done again in the next round (a new ring among those left). The round's
  // lowest live member decides.
  bool Settle(bool completed);
  // Any member, at the end: a newcomer still waiting learns that no round will come.
  void End();
  int64_t round() const { return current_.round; }
  const std::vector<int>& members() const { return current_.members; }
  const std::vector<int>& joiners() const { return current_.joiners; }
  // The ring rank of the lowest member that is no newcomer: it hands the newcomers the state.
  int StateRoot() const;
  // Sent over every ring so far.
  int64_t bytes_sent() const { return (ring_ ? ring_->bytes_sent() : 0) + bytes_before_; }

 private:
  struct Decision {
    int64_t round = -1, ring = -1;
    bool over = false;
    std::vector<int> members, joiners;
  };
  struct Announcement {
    int64_t round = -1;
    bool joiner = false;
  };
  Decision Decide(int64_t round, bool admit_joiners, int64_t step);  // the round's decider
  bool Commits(int64_t round, bool completed);                       // the outcome's decider
  // The lowest of `members` not gone since round `decided` was decided: listed dead, or
  // announcing itself as a newcomer for a later round (restarted).
  int LowestLive(const std::vector<int>& members, int64_t decided);
  bool Gone(int rank, int64_t decided, const std::vector<int>& dead);
  // Sets `key` to `value` (for `round`) unless some value for `round` or later is there;
  // returns the value that holds for the round (this one, or another decider's).
  std::string Claim(const std::string& key, int64_t round, const std::string& value);
  std::optional<Decision> ReadDecision();
  std::vector<int> DeadRanks();
  std::optional<Announcement> ReadAnnouncement(int rank);
  std::optional<std::string> Peek(const std::string& key);
  void Announce(int64_t round, bool joiner);
  Communicator& Adopt(const Decision& d);  // the ring among d's members

  AlgorithmEnv env_;
  std::string name_;
  int timeout_ms_;
  Decision current_;  // the last round this worker took part in
  std::unique_ptr<Communicator> ring_;
  int64_t bytes_before_ = 0;  // sent over rings since dropped
  bool ring_broken_ = false;  // the last round failed: its ring is aborted
  bool decided_ = false;      // this worker decided the round it adopts (and said so)
};

}  // namespace shoal
