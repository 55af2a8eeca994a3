#include "common/flags.h"

#include <gflags/gflags.h>

namespace shoal {

namespace {

// "" when every flag in argv names a defined gflag and holds a value of its type, else the
// first bad one as typed. Positional arguments are left to StrayArgument.
std::string CheckFlagSyntax(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--") break;  // gflags stops here too
    if (a.size() < 2 || a[0] != '-') continue;
    const std::string body = a.substr(a[1] == '-' ? 2 : 1);
    const auto eq = body.find('=');
    const std::string name = body.substr(0, eq);
    const bool has_value = eq != std::string::npos;
    std::string value = has_value ? body.substr(eq + 1) : "";
    gflags::CommandLineFlagInfo info;
    if (!gflags::GetCommandLineFlagInfo(name.c_str(), &info)) {
      // --noresume: gflags' negation of a bool flag.
      if (!has_value && name.rfind("no", 0) == 0 && gflags::GetCommandLineFlagInfo(name.substr(2).c_str(), &info) &&
          info.type == "bool")
        continue;
      return a + ": unknown flag";
    }
    if (info.type == "bool" && !has_value) continue;  // --resume alone means true
    if (!has_value) {
      if (i + 1 >= argc) return a + ": missing its value";
      value = argv[++i];
    }
    if (info.type == "string") continue;  // any text; the binary checks what it means
    // Sets the flag as gflags will again; what matters is whether gflags accepts the value.
    if (gflags::SetCommandLineOption(name.c_str(), value.c_str()).empty())
      return (has_value ? a : a + " " + value) + ": not a valid " + info.type + " value" +
             (info.type == "int32" ? " (a whole number from -2147483648 to 2147483647)" : "");
  }
  return "";
}

// After gflags has removed the flags: what is left is an argument nobody reads.
std::string StrayArgument(int argc, char** argv) {
  if (argc <= 1) return "";
  return std::string("unexpected argument '") + argv[1] + "'";
}

}  // namespace

std::string ParseFlags(int* argc, char*** argv) {
  std::string bad = CheckFlagSyntax(*argc, *argv);
  if (!bad.empty()) return bad;
  gflags::ParseCommandLineFlags(argc, argv, true);
  return StrayArgument(*argc, *argv);
}

}  // namespace shoal
