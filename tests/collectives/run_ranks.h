// Runs a body in `size` forked processes (one per rank) and returns their exit codes: an
// exception is exit 42 (its message on stderr), a signal 128 + signo. The wait is bounded:
// stragglers are SIGKILLed, so no process outlives the test.
#pragma once
#include <functional>
#include <vector>

namespace shoal {

std::vector<int> RunRanks(int size, const std::function<int(int)>& body, int timeout_s = 60);

}  // namespace shoal
