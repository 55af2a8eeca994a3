// Command-line checks the binaries share (shoal-server, shoal-worker). gflags reports a
// malformed value or an unknown flag itself and exits with code 1, which the launcher takes
// for a crash worth restarting; a bad flag is the user's own fault, exit code 2, named as
// typed. So the binaries check argv with CheckFlagSyntax before gflags parses it.
#pragma once
#include <string>

namespace shoal {

// "" when every flag in argv names a defined gflag and holds a value of its type, else one
// line naming the first bad one as typed: "--shard abc: not a valid int32 value",
// "--bogus: unknown flag", "--bind: missing its value". Positional arguments are left to
// the caller (see UnexpectedArguments).
std::string CheckFlagSyntax(int argc, char** argv);

// After gflags has removed the flags: "" when nothing is left, else "unexpected argument
// 'X'" (a value that lost its flag, e.g. "--resume false": --resume takes no separate value).
std::string UnexpectedArguments(int argc, char** argv);

}  // namespace shoal
