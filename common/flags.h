// Command-line parsing the binaries share (shoal-server, shoal-worker). gflags reports a
// malformed value or an unknown flag itself and exits with code 1, which the launcher takes
// for a crash worth restarting; a bad flag is the user's own fault, exit code 2, named as
// typed. So the binaries parse with ParseFlags, which checks argv before gflags sees it.
#pragma once
#include <string>

namespace shoal {

// gflags::ParseCommandLineFlags(argc, argv, true), preceded by a check of every flag and
// followed by one for stray arguments. "" when all is well, else one line naming the first
// bad one as typed (nothing parsed if a flag is bad): "--shard abc: not a valid int32
// value", "--bogus: unknown flag", "--bind: missing its value", "unexpected argument 'X'"
// (a value that lost its flag, e.g. "--resume false": --resume takes no separate value).
std::string ParseFlags(int* argc, char*** argv);

}  // namespace shoal
