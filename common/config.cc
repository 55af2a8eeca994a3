#include "common/config.h"

#include <arpa/inet.h>
#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <set>
#include <sstream>
#include <toml++/toml.h>

#include "common/dtype.h"
#include "common/error.h"

namespace shoal {
namespace {

std::string Describe(const toml::node* n) {
  if (!n) return "nothing";
  std::ostringstream os;
  switch (n->type()) {
    case toml::node_type::string:
      os << "string \"" << *n->value<std::string>() << "\"";
      break;
    case toml::node_type::integer:
      os << "integer " << *n->value<int64_t>();
      break;
    case toml::node_type::floating_point:
      os << "float " << *n->value<double>();
      break;
    case toml::node_type::boolean:
      os << (*n->value<bool>() ? "true" : "false");
      break;
    case toml::node_type::table:
      os << "a table";
      break;
    case toml::node_type::array:
      os << "an array";
      break;
    default:
      os << "a date/time";
      break;
  }
  return os.str();
}

// Reads one typed section, rejecting keys it does not know (typos must not pass silently).
class SectionReader {
 public:
  SectionReader(const std::string& file, const toml::table& root, const std::string& name, std::set<std::string> known)
      : file_(file), name_(name), known_(std::move(known)) {
    const toml::node* n = root.get(name);
    if (n && !n->is_table()) Fail("", "expected a table [" + name + "], got " + Describe(n));
    table_ = n ? n->as_table() : nullptr;
    if (table_)
      for (auto&& [k, v] : *table_)
        if (!known_.count(std::string(k.str()))) Fail(std::string(k.str()), "unknown key (known: " + KnownList() + ")");
  }
  bool present() const { return table_ != nullptr; }
  const toml::node* Get(const std::string& key) const { return table_ ? table_->get(key) : nullptr; }

  std::string String(const std::string& key, const std::string& def, bool required = false) const {
    const toml::node* n = Get(key);
    if (!n) {
      if (required) Fail(key, "missing (expected a string)");
      return def;
    }
    if (!n->is_string()) Fail(key, "expected a string, got " + Describe(n));
    return *n->value<std::string>();
  }
  int64_t Int(const std::string& key, int64_t def, int64_t lo, int64_t hi) const {
    const toml::node* n = Get(key);
    if (!n) return def;
    if (!n->is_integer())
      Fail(key, "expected an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " + Describe(n));
    int64_t v = *n->value<int64_t>();
    if (v < lo || v > hi)
      Fail(key,
           "expected an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " + std::to_string(v));
    return v;
  }
  double Double(const std::string& key, double def, double lo, double hi) const {
    const toml::node* n = Get(key);
    if (!n) return def;
    if (!n->is_number()) Fail(key, "expected a number, got " + Describe(n));
    double v = *n->value<double>();
    if (!(v >= lo && v <= hi)) {
      std::ostringstream os;
      os << "expected a number in [" << lo << ", " << hi << "], got " << v;
      Fail(key, os.str());
    }
    return v;
  }
  bool Bool(const std::string& key, bool def) const {
    const toml::node* n = Get(key);
    if (!n) return def;
    if (!n->is_boolean()) Fail(key, "expected true or false, got " + Describe(n));
    return *n->value<bool>();
  }
  [[noreturn]] void Fail(const std::string& key, const std::string& what) const {
    throw Error(file_ + ": [" + name_ + "]" + (key.empty() ? "" : " " + key) + ": " + what);
  }
  const toml::table* table() const { return table_; }

 private:
  std::string KnownList() const {
    std::string s;
    for (auto& k : known_) s += (s.empty() ? "" : ", ") + k;
    return s;
  }
  std::string file_, name_;
  std::set<std::string> known_;
  const toml::table* table_ = nullptr;
};

// [algorithm] / [optimizer]: free-form scalars, typed later by the code that reads them.
ConfigSection ReadFreeSection(const std::string& file, const toml::table& root, const std::string& name,
                              std::string* out_name, const std::string& default_name) {
  ConfigSection s(file, name);
  const toml::node* n = root.get(name);
  *out_name = default_name;
  if (!n) return s;
  if (!n->is_table()) throw Error(file + ": [" + name + "]: expected a table, got " + Describe(n));
  for (auto&& [k, v] : *n->as_table()) {
    std::string key(k.str());
    if (key == "name") {
      if (!v.is_string()) throw Error(file + ": [" + name + "] name: expected a string, got " + Describe(&v));
      *out_name = *v.value<std::string>();
      continue;
    }
    if (v.is_boolean())
      s.Set(key, *v.value<bool>());
    else if (v.is_integer())
      s.Set(key, *v.value<int64_t>());
    else if (v.is_floating_point())
      s.Set(key, *v.value<double>());
    else if (v.is_string())
      s.Set(key, *v.value<std::string>());
    else
      throw Error(file + ": [" + name + "] " + key + ": expected a string, number or boolean, got " + Describe(&v));
  }
  return s;
}

// `where` names the value in full ("FILE: [cluster] coordinator", or the flag that set it).
void CheckHostPort(const std::string& where, const std::string& hp) {
  auto colon = hp.rfind(':');
  bool ok = colon != std::string::npos && colon > 0 && IsPort(hp.substr(colon + 1));
  if (!ok) throw Error(where + ": expected \"host:port\" with port 1-65535, got \"" + hp + "\"");
}
void CheckHostPort(const std::string& file, const std::string& where, const std::string& hp) {
  CheckHostPort(file + ": " + where, hp);
}

// What an error names a value by: the flag that overrode it, else the job file's key.
std::string Origin(const JobConfig& c, const FlagOverrides& flags, const std::string& key) {
  auto it = flags.find(key);
  if (it == flags.end()) return c.path + ": " + key;
  return it->second + " (overriding " + key + " of the job file)";
}

// [train] batch_schedule against [train] epochs, the worker count and [data] batch_size: stages
// from epoch 0, increasing, each before the last epoch, each global batch a whole number of
// samples per worker (balancing splits it unevenly, but the equal share must exist).
void CheckBatchSchedule(const JobConfig& c, const FlagOverrides& flags) {
  if (c.batch_schedule.empty()) return;
  const std::string where = c.path + ": [train] batch_schedule: ";
  const int64_t world = int64_t(c.workers.size());
  for (size_t i = 0; i < c.batch_schedule.size(); ++i) {
    const BatchStage& s = c.batch_schedule[i];
    const std::string stage =
        "stage " + std::to_string(i) + " [" + std::to_string(s.epoch) + ", " + std::to_string(s.global_batch) + "]: ";
    if (i == 0 && s.epoch != 0) throw Error(where + stage + "the first stage must start at epoch 0");
    if (i > 0 && s.epoch <= c.batch_schedule[i - 1].epoch)
      throw Error(where + stage + "epochs must increase (the stage before starts at epoch " +
                  std::to_string(c.batch_schedule[i - 1].epoch) + ")");
    if (s.epoch >= c.epochs)
      throw Error(Origin(c, flags, "[train] epochs") + " = " + std::to_string(c.epochs) + ": [train] batch_schedule " +
                  stage + "starts after the last epoch (epochs count from 0)");
    if (s.global_batch < 1 || s.global_batch > kMaxBatchSize * world)
      throw Error(where + stage + "expected a global batch in [1, " + std::to_string(kMaxBatchSize * world) + "]");
    if (s.global_batch % world != 0)
      throw Error(where + stage + "the global batch is not divisible by the job's " + std::to_string(world) +
                  " workers");
  }
  const int64_t first = c.batch_schedule[0].global_batch / world;
  if (c.batch_size != first)
    throw Error(Origin(c, flags, "[data] batch_size") + " = " + std::to_string(c.batch_size) +
                " disagrees with [train] batch_schedule, whose first stage gives each of the " + std::to_string(world) +
                " workers " + std::to_string(first) + " (leave batch_size out with a schedule)");
}

// Without [security] keys, a job whose addresses leave this machine is refused unless
// allow_plaintext says the user means it; the error names the address and both ways out.
// The status page is plain HTTP with no CurveZMQ, so keys do not cover it (its token, in a
// job with keys, would cross the network in the clear): a non-loopback status_bind needs
// allow_plaintext even in a job that has keys.
void CheckPlaintextPolicy(const JobConfig& c, const FlagOverrides& flags) {
  if (c.allow_plaintext) return;
  if (!IsLoopbackHost(c.status_bind))
    throw Error(c.path + ": [job] status_bind = \"" + c.status_bind +
                "\" is not a loopback address, and the status page is plain HTTP (no CurveZMQ, even with [security] "
                "keys), so its figures (and a keyed job's token) would cross the network unencrypted: bind it to "
                "\"127.0.0.1\" and tunnel to it (ssh -L) or set [security] allow_plaintext = true");
  if (c.curve_enabled()) return;
  auto refuse = [&](const std::string& where, const std::string& addr) {
    throw Error(Origin(c, flags, where) + " = \"" + addr +
                "\" is not a loopback address and the job has no [security] keys, so its traffic would cross the "
                "network unencrypted and unauthenticated: add keys (./shoal keygen prints a [security] section) or "
                "set [security] allow_plaintext = true");
  };
  for (size_t k = 0; k < c.servers.size(); ++k)
    if (!IsLoopbackHost(c.servers[k].substr(0, c.servers[k].rfind(':'))))
      refuse("[cluster] servers[" + std::to_string(k) + "]", c.servers[k]);
  if (!c.coordinator.empty() && !IsLoopbackHost(c.coordinator.substr(0, c.coordinator.rfind(':'))))
    refuse("[cluster] coordinator", c.coordinator);
  for (size_t r = 0; r < c.workers.size(); ++r)
    if (!IsLoopbackHost(c.workers[r].host))
      refuse("[cluster] workers[" + std::to_string(r) + "] host", c.workers[r].host);
}

// [model] loss_scale = "dynamic" | "none" | <number>, loss_scale_init, loss_scale_growth_interval.
void ReadLossScale(const SectionReader& model, JobConfig* c) {
  std::ostringstream range;
  range << "(0, " << kMaxLossScale << " = 2^126]";
  c->loss_scale = c->precision == "fp16" ? "dynamic" : "none";
  if (const toml::node* n = model.Get("loss_scale")) {
    if (n->is_string()) {
      c->loss_scale = *n->value<std::string>();
      if (c->loss_scale != "dynamic" && c->loss_scale != "none")
        model.Fail("loss_scale",
                   "expected \"dynamic\", \"none\" or a number in " + range.str() + ", got \"" + c->loss_scale + "\"");
    } else if (n->is_number()) {
      double v = *n->value<double>();
      if (!(v > 0 && v <= kMaxLossScale)) {
        std::ostringstream os;
        os << "expected \"dynamic\", \"none\" or a number in " << range.str() << ", got " << v;
        model.Fail("loss_scale", os.str());
      }
      c->loss_scale = "fixed";
      c->loss_scale_init = v;
    } else {
      model.Fail("loss_scale", "expected \"dynamic\", \"none\" or a number in " + range.str() + ", got " + Describe(n));
    }
  }
  const bool dynamic = c->loss_scale == "dynamic";
  for (const char* k : {"loss_scale_init", "loss_scale_growth_interval"})
    if (model.Get(k) && !dynamic)
      model.Fail(k, std::string("only used with loss_scale = \"dynamic\" (loss_scale is ") +
                        (c->loss_scale == "fixed" ? "a fixed number" : "\"" + c->loss_scale + "\"") + ")");
  if (dynamic) {
    c->loss_scale_init = model.Double("loss_scale_init", 65536, 0, kMaxLossScaleInit);
    if (!(c->loss_scale_init > 0)) model.Fail("loss_scale_init", "expected a number in (0, 1e+300], got 0");
    c->loss_scale_growth_interval = model.Int("loss_scale_growth_interval", 2000, 1, int64_t(1) << 40);
  }
}

}  // namespace

std::string JobConfig::CoordinatorAddress(bool has_servers) const {
  if (!coordinator.empty()) return coordinator;
  if (has_servers && !servers.empty()) return servers[0];
  std::string host = workers.empty() ? "127.0.0.1" : workers[0].host;
  return host + ":" + std::to_string(kDefaultCoordinatorPort);
}

bool IsLoopbackHost(const std::string& host) { return host == "localhost" || host.rfind("127.", 0) == 0; }

std::string ConfigSection::Where(const std::string& key) const { return file_ + ": [" + section_ + "] " + key; }

namespace {
size_t EditDistance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

std::string Initials(const std::string& key) {
  std::string s;
  for (size_t i = 0; i < key.size(); ++i)
    if (key[i] != '_' && (i == 0 || key[i - 1] == '_')) s += key[i];
  return s;
}
}  // namespace

std::string NearestKey(const std::string& key, const std::vector<std::string>& known) {
  std::string best;
  size_t best_d = std::string::npos;
  for (auto& k : known) {
    size_t d = EditDistance(key, k);
    if (d < best_d) best_d = d, best = k;
  }
  // Close means at most a third of the key's letters differ (at least 1, at most 3).
  size_t limit = std::min<size_t>(3, std::max<size_t>(1, key.size() / 3));
  if (!best.empty() && best_d <= limit) return best;
  std::string ini = Initials(key);
  if (ini.size() >= 2 && ini != key)
    for (auto& k : known)
      if (k == ini) return k;
  return "";
}

void ConfigSection::CheckKeys(const std::vector<std::string>& known, const std::string& owner) const {
  for (auto& [key, v] : values_) {
    if (std::find(known.begin(), known.end(), key) != known.end()) continue;
    std::string near = NearestKey(key, known);
    std::string hint;
    if (!near.empty()) {
      hint = "did you mean '" + near + "'?";
    } else {
      std::vector<std::string> sorted(known);
      std::sort(sorted.begin(), sorted.end());
      for (auto& k : sorted) hint += (hint.empty() ? "known: " : ", ") + k;
      if (hint.empty()) hint = "it takes no keys besides name";
    }
    throw Error(Where(key) + ": unknown key for " + owner + " (" + hint + ")");
  }
}

double ConfigSection::GetDouble(const std::string& key, double def) const {
  auto it = values_.find(key);
  if (it == values_.end()) return def;
  if (auto* d = std::get_if<double>(&it->second)) return *d;
  if (auto* i = std::get_if<int64_t>(&it->second)) return double(*i);
  throw Error(Where(key) + ": expected a number");
}
double ConfigSection::GetDouble(const std::string& key, double def, double lo, double hi) const {
  double v = GetDouble(key, def);
  if (!(v >= lo && v <= hi)) {
    std::ostringstream os;
    os << Where(key) << ": expected a number in [" << lo << ", " << hi << "], got " << v;
    throw Error(os.str());
  }
  return v;
}
int64_t ConfigSection::GetInt(const std::string& key, int64_t def) const {
  auto it = values_.find(key);
  if (it == values_.end()) return def;
  if (auto* i = std::get_if<int64_t>(&it->second)) return *i;
  throw Error(Where(key) + ": expected an integer");
}
int64_t ConfigSection::GetInt(const std::string& key, int64_t def, int64_t lo, int64_t hi) const {
  int64_t v = GetInt(key, def);
  if (v < lo || v > hi)
    throw Error(Where(key) + ": expected an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " +
                std::to_string(v));
  return v;
}
bool ConfigSection::GetBool(const std::string& key, bool def) const {
  auto it = values_.find(key);
  if (it == values_.end()) return def;
  if (auto* b = std::get_if<bool>(&it->second)) return *b;
  throw Error(Where(key) + ": expected true or false");
}
std::string ConfigSection::GetString(const std::string& key, const std::string& def) const {
  auto it = values_.find(key);
  if (it == values_.end()) return def;
  if (auto* s = std::get_if<std::string>(&it->second)) return *s;
  throw Error(Where(key) + ": expected a string");
}

void CheckJobLimits(const JobConfig& c, const FlagOverrides& flags) {
  auto range = [&](const char* where, int64_t v, int64_t lo, int64_t hi) {
    if (v < lo || v > hi)
      throw Error(Origin(c, flags, where) + ": expected an integer in [" + std::to_string(lo) + ", " +
                  std::to_string(hi) + "], got " + std::to_string(v));
  };
  const int64_t world = int64_t(c.workers.size());
  range("[cluster] workers", world, 1, kMaxWorkers);
  range("[data] batch_size", c.batch_size, 1, kMaxBatchSize);
  range("[train] epochs", c.epochs, 1, kMaxEpochs);
  range("[data] synthetic_samples", c.synthetic_samples, 1, kMaxSamples);
  range("[train] threads", c.threads, 0, kMaxThreads);
  range("[train] max_steps", c.max_steps, 0, INT64_MAX);
  // The synthetic training set holds synthetic_samples per worker; the ranges above keep
  // this product from overflowing, the limit keeps it a data set that fits in memory.
  if (c.synthetic_samples * world > kMaxSamples)
    throw Error(c.path + ": [data] synthetic_samples: " + std::to_string(c.synthetic_samples) + " per worker x " +
                std::to_string(world) + " workers = " + std::to_string(c.synthetic_samples * world) +
                " samples, more than the limit of " + std::to_string(kMaxSamples));
  // Addresses too: a worker's --coordinator must pass what [cluster] coordinator passes, or
  // a flag could take a keyless job off this machine.
  if (!c.coordinator.empty()) CheckHostPort(Origin(c, flags, "[cluster] coordinator"), c.coordinator);
  CheckPlaintextPolicy(c, flags);
  CheckBatchSchedule(c, flags);
}

namespace {

// "FILE:LINE:COL" of byte `at`, 1-based as editors count.
std::string PositionOf(const std::string& text, size_t at, const std::string& file) {
  size_t line_start = text.rfind('\n', at == 0 ? 0 : at - 1);
  line_start = (line_start == std::string::npos || at == 0) ? 0 : line_start + 1;
  size_t line = 1 + std::count(text.begin(), text.begin() + long(at), '\n');
  return file + ":" + std::to_string(line) + ":" + std::to_string(at - line_start + 1);
}

// Decodes the UTF-8 sequence at t[i] into *cp and returns its length, or 0 if invalid.
size_t DecodeUtf8(const std::string& t, size_t i, uint32_t* cp) {
  auto b = [&](size_t k) { return i + k < t.size() ? static_cast<unsigned char>(t[i + k]) : 0u; };
  unsigned c = b(0);
  size_t n = c >= 0xf0 && c < 0xf5 ? 4 : c >= 0xe0 ? 3 : c >= 0xc2 && c < 0xe0 ? 2 : 0;
  if (n == 0 || c >= 0xf5) return 0;
  uint32_t v = c & (0x7f >> n);
  for (size_t k = 1; k < n; ++k) {
    if ((b(k) & 0xc0) != 0x80) return 0;
    v = (v << 6) | (b(k) & 0x3f);
  }
  static const uint32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
  if (v < kMin[n] || v > 0x10ffff || (v >= 0xd800 && v < 0xe000)) return 0;
  *cp = v;
  return n;
}

// toml++ 3.3 asserts instead of reporting an error (abort in debug builds, undefined
// behaviour under NDEBUG) on some inputs: a control character or a character no key
// starts with at the start of a table header ("[= 1]"), a '}' where an array expects a
// value ("[1, }"), and many non-ASCII characters
// wherever it tests for whitespace outside a string (its table hits "unreachable" for
// e.g. U+00E9 or U+047B). So it only ever gets ASCII, with the same meaning: strings
// become basic strings whose non-ASCII characters are \u escapes (a literal string's
// backslashes and quotes escaped too), comments lose their non-ASCII characters, and
// anything else that would reach those assertions is an error naming FILE:LINE:COL.
// Follows strings, comments and brackets just far enough to tell headers from arrays.
std::string AsciiTomlText(const std::string& t, const std::string& file) {
  auto fail = [&](size_t at, const std::string& why) { throw Error(PositionOf(t, at, file) + ": " + why); };
  auto key_start = [](char c) {
    return isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '"' || c == '\'' || c == ']';
  };
  std::string out;
  out.reserve(t.size());
  enum { kNone, kBasic, kLiteral, kComment } in = kNone;
  bool multi = false;
  std::string open;  // the [ and { of values not yet closed
  bool line_start = true;
  for (size_t i = 0; i < t.size(); ++i) {
    const char c = t[i];
    const auto u = static_cast<unsigned char>(c);
    if ((u < 0x20 && c != '\t' && c != '\n' && c != '\r') || u == 0x7f) {
      char code[8];
      snprintf(code, sizeof code, "0x%02x", u);
      fail(i, std::string("control character ") + code + " (TOML allows only tab and line breaks)");
    }
    if (u >= 0x80) {
      uint32_t cp = 0;
      size_t n = DecodeUtf8(t, i, &cp);
      if (n == 0) fail(i, "invalid UTF-8");
      if (in == kBasic || in == kLiteral) {
        char esc[16];
        snprintf(esc, sizeof esc, cp > 0xffff ? "\\U%08X" : "\\u%04X", unsigned(cp));
        out += esc;
      } else if (in == kComment) {
        out += '?';
      } else {
        fail(i,
             "TOML syntax error: non-ASCII character outside a string or comment (a bare key is letters, digits, _ "
             "and -)");
      }
      i += n - 1;
      continue;
    }
    if (in == kComment) {
      out += c;
      if (c == '\n') in = kNone, line_start = true;
      continue;
    }
    if (in != kNone) {
      const char q = in == kBasic ? '"' : '\'';
      if (!multi && c == '\n') {
        out += c;
        in = kNone, line_start = true;  // unterminated; toml++ reports it
      } else if (c == q && (!multi || t.compare(i, 3, std::string(3, q)) == 0)) {
        size_t k = 1;
        if (multi)
          while (k < 5 && i + k < t.size() && t[i + k] == q) ++k;  // up to two quotes may end the content
        out.append(k - (multi ? 3 : 1), q);
        out.append(multi ? 3 : 1, '"');
        i += k - 1;
        in = kNone;
      } else if (in == kLiteral && (c == '\\' || c == '"')) {
        out += '\\';
        out += c;
      } else if (in == kBasic && c == '\\' && i + 1 < t.size()) {
        if (static_cast<unsigned char>(t[i + 1]) >= 0x80) fail(i + 1, "TOML syntax error: invalid escape sequence");
        out += c;
        out += t[++i];
      } else {
        out += c;
      }
      continue;
    }
    out += c;
    if (c == '\n') {
      line_start = true;
      continue;
    }
    if (c == ' ' || c == '\t' || c == '\r') continue;
    const bool first = line_start;
    line_start = false;
    if (c == '#') {
      in = kComment;
    } else if (c == '"' || c == '\'') {
      in = c == '"' ? kBasic : kLiteral;
      multi = t.compare(i, 3, std::string(3, c)) == 0;
      out.back() = '"';
      if (multi) out.append(2, '"'), i += 2;
    } else if (c == '[' && open.empty() && first) {
      size_t j = i + 1;
      while (j < t.size() && (t[j] == ' ' || t[j] == '\t')) ++j;
      if (j < t.size() && t[j] == '[') ++j;
      while (j < t.size() && (t[j] == ' ' || t[j] == '\t')) ++j;
      // A control character there gets its own error when the loop reaches it.
      bool control =
          j < t.size() && t[j] != '\n' && t[j] != '\r' && (static_cast<unsigned char>(t[j]) < 0x20 || t[j] == 0x7f);
      if (!control && (j >= t.size() || !key_start(t[j])))
        fail(j, "TOML syntax error: a table header must start with a name (letters, digits, _ or -) or a quoted key");
    } else if (c == '[' || c == '{') {
      open += c;
    } else if (c == '}' && !open.empty() && open.back() == '[') {
      fail(i, "TOML syntax error: '}' where an array value or ']' belongs");
    } else if ((c == ']' || c == '}') && !open.empty()) {
      open.pop_back();
    }
  }
  return out;
}

}  // namespace

JobConfig ParseJobConfig(const std::string& text, const std::string& file) {
  toml::table root;
  try {
    root = toml::parse(AsciiTomlText(text, file), file);
  } catch (const toml::parse_error& e) {
    std::ostringstream os;
    os << file << ":" << e.source().begin.line << ":" << e.source().begin.column
       << ": TOML syntax error: " << e.description();
    throw Error(os.str());
  }
  static const std::set<std::string> kSections = {"job",  "cluster",   "security",  "model",
                                                  "data", "algorithm", "optimizer", "train"};
  for (auto&& [k, v] : root)
    if (!kSections.count(std::string(k.str())))
      throw Error(file + ": unknown section [" + std::string(k.str()) +
                  "] (known: algorithm, cluster, data, job, model, optimizer, security, train)");

  JobConfig c;
  c.path = file;

  SectionReader job(file, root, "job",
                    {"name", "seed", "output_dir", "checkpoint_dir", "checkpoint_every_steps", "export_weights",
                     "export_onnx", "max_restarts", "status_port", "status_bind", "straggler_ratio"});
  c.name = job.String("name", "", true);
  if (c.name.empty() || c.name.find_first_of("/\\ \t\n\"") != std::string::npos)
    job.Fail("name", "expected a non-empty name without slashes, spaces or quotes, got \"" + c.name + "\"");
  c.seed = uint64_t(job.Int("seed", 42, 0, INT64_MAX));
  c.output_dir = job.String("output_dir", "runs/" + c.name);
  // "" would put logs/ and metrics.jsonl at the filesystem root.
  if (c.output_dir.empty())
    job.Fail("output_dir", "expected a directory, got \"\" (leave the key out for runs/<name>)");
  c.checkpoint_dir = job.String("checkpoint_dir", "");
  c.checkpoint_every_steps = job.Int("checkpoint_every_steps", 0, 0, INT64_MAX);
  c.max_restarts = job.Int("max_restarts", 0, 0, 1000);
  c.export_weights = job.String("export_weights", "");
  c.export_onnx = job.String("export_onnx", "");
  if (!c.export_onnx.empty() && c.export_onnx == c.export_weights)
    job.Fail("export_onnx", "\"" + c.export_onnx + "\" is export_weights' file too; give each its own");
  c.status_port = job.Int("status_port", 0, 0, 65535);
  c.status_bind = job.String("status_bind", "127.0.0.1");
  in_addr bind_addr{};
  if (inet_pton(AF_INET, c.status_bind.c_str(), &bind_addr) != 1)
    job.Fail("status_bind", "expected an IPv4 address (\"127.0.0.1\": loopback, \"0.0.0.0\": every interface), got \"" +
                                c.status_bind + "\"");
  c.straggler_ratio = job.Double("straggler_ratio", 1.5, 1.05, 1000);

  SectionReader cl(file, root, "cluster",
                   {"servers", "workers", "heartbeat_ms", "heartbeat_timeout_ms", "coordinator"});
  c.coordinator = cl.String("coordinator", "");
  if (!c.coordinator.empty()) CheckHostPort(file, "[cluster] coordinator", c.coordinator);
  if (const toml::node* s = cl.Get("servers")) {
    if (!s->is_array()) cl.Fail("servers", "expected an array of \"host:port\" strings, got " + Describe(s));
    int i = 0;
    for (auto& e : *s->as_array()) {
      std::string where = "[cluster] servers[" + std::to_string(i++) + "]";
      if (!e.is_string()) throw Error(file + ": " + where + ": expected a \"host:port\" string, got " + Describe(&e));
      CheckHostPort(file, where, *e.value<std::string>());
      c.servers.push_back(*e.value<std::string>());
    }
    std::set<std::string> uniq(c.servers.begin(), c.servers.end());
    if (uniq.size() != c.servers.size()) cl.Fail("servers", "the same address is listed twice");
  }
  if (const toml::node* w = cl.Get("workers")) {
    if (w->is_integer()) {
      int64_t n = *w->value<int64_t>();
      if (n < 1 || n > kMaxWorkers)
        cl.Fail("workers", "expected an integer in [1, " + std::to_string(kMaxWorkers) + "], got " + std::to_string(n));
      c.workers.resize(size_t(n));
    } else if (w->is_array()) {
      int i = 0;
      for (auto& e : *w->as_array()) {
        std::string where = file + ": [cluster] workers[" + std::to_string(i++) + "]";
        if (!e.is_table())
          throw Error(where + ": expected a table {host, device, slowdown, bandwidth_mbps, cpu_quota}, got " +
                      Describe(&e));
        WorkerSpec ws;
        for (auto&& [k, v] : *e.as_table()) {
          std::string key(k.str());
          if (key == "host" && v.is_string())
            ws.host = *v.value<std::string>();
          else if (key == "device" && v.is_string())
            ws.device = *v.value<std::string>();
          // Bounded: both become sleeps, and a std::chrono sleep of 1e300 s overflows its
          // nanosecond count (a slowdown of 1e300 ran at full speed).
          else if (key == "slowdown" && v.is_number() && *v.value<double>() >= 0 && *v.value<double>() <= 1000)
            ws.slowdown = *v.value<double>();
          else if (key == "bandwidth_mbps" && v.is_number() &&
                   (*v.value<double>() == 0 || (*v.value<double>() >= 0.01 && *v.value<double>() <= 1e7)))
            ws.bandwidth_mbps = *v.value<double>();
          else if (key == "cpu_quota" && v.is_number() && *v.value<double>() >= kMinCpuQuota &&
                   *v.value<double>() <= kMaxCpuQuota)
            ws.cpu_quota = *v.value<double>();
          else
            throw Error(where + " " + key + ": unexpected " + Describe(&v) +
                        " (keys: host string, device \"cpu\"|\"cuda:N\", slowdown 0-1000, bandwidth_mbps 0 (no "
                        "limit) or 0.01-1e7, cpu_quota 0.01-1024 cores)");
        }
        if (!(ws.device == "cpu" || ws.device == "cuda" || ws.device.rfind("cuda:", 0) == 0))
          throw Error(where + " device: expected \"cpu\" or \"cuda:N\", got \"" + ws.device + "\"");
        c.workers.push_back(ws);
      }
      if (c.workers.empty()) cl.Fail("workers", "expected at least one worker");
      if (int64_t(c.workers.size()) > kMaxWorkers)
        cl.Fail("workers", "expected at most " + std::to_string(kMaxWorkers) + " workers, got " +
                               std::to_string(c.workers.size()));
    } else {
      cl.Fail("workers", "expected a count or an array of worker tables, got " + Describe(w));
    }
  }
  if (c.workers.empty()) c.workers.resize(1);
  c.heartbeat_ms = cl.Int("heartbeat_ms", 500, 10, 600000);
  c.heartbeat_timeout_ms = cl.Int("heartbeat_timeout_ms", 5000, 50, 3600000);
  if (c.heartbeat_timeout_ms <= c.heartbeat_ms)
    cl.Fail("heartbeat_timeout_ms", "must be larger than heartbeat_ms (" + std::to_string(c.heartbeat_ms) + ")");

  SectionReader sec(
      file, root, "security",
      {"server_public_key", "server_secret_key", "client_public_key", "client_secret_key", "allow_plaintext"});
  c.curve_server_public = sec.String("server_public_key", "");
  c.curve_server_secret = sec.String("server_secret_key", "");
  c.curve_client_public = sec.String("client_public_key", "");
  c.curve_client_secret = sec.String("client_secret_key", "");
  c.allow_plaintext = sec.Bool("allow_plaintext", false);
  const bool any_key = !c.curve_server_public.empty() || !c.curve_server_secret.empty() ||
                       !c.curve_client_public.empty() || !c.curve_client_secret.empty();
  if (any_key) {
    for (const char* k : {"server_public_key", "server_secret_key", "client_public_key", "client_secret_key"}) {
      std::string v = sec.String(k, "");
      if (v.size() != 40)
        sec.Fail(k, "expected a 40-character Z85 CurveZMQ key (make them with ./shoal keygen), got " +
                        std::to_string(v.size()) + " characters");
    }
  }

  SectionReader model(file, root, "model",
                      {"name", "onnx", "onnx_constants", "zero_gamma_init", "label_smoothing", "init", "precision",
                       "loss_scale", "loss_scale_init", "loss_scale_growth_interval"});
  c.onnx_model = model.String("onnx", "");
  if (!c.onnx_model.empty()) {
    if (model.Get("name")) model.Fail("onnx", "give [model] name (a built-in model) or onnx (a file), not both");
    c.model = "onnx";
    if (const toml::node* k = model.Get("onnx_constants")) {
      if (!k->is_array()) model.Fail("onnx_constants", "expected an array of initializer names, got " + Describe(k));
      for (auto& e : *k->as_array()) {
        if (!e.is_string()) model.Fail("onnx_constants", "expected initializer names (strings), got " + Describe(&e));
        c.onnx_constants.push_back(*e.value<std::string>());
      }
    }
  } else {
    if (model.Get("onnx_constants")) model.Fail("onnx_constants", "only with [model] onnx");
    c.model = model.String("name", "mlp");
    static const std::set<std::string> kModels = {"mlp", "lenet", "resnet20", "resnet50"};
    if (!kModels.count(c.model))
      model.Fail("name", "unknown model \"" + c.model +
                             "\" (known: lenet, mlp, resnet20, resnet50; or [model] onnx = "
                             "\"file.onnx\")");
  }
  c.zero_gamma_init = model.Bool("zero_gamma_init", true);
  c.label_smoothing = model.Double("label_smoothing", 0.0, 0.0, 0.999);
  c.precision = model.String("precision", "fp32");
  try {
    ParsePrecision(c.precision);
  } catch (const Error& e) {
    model.Fail("precision", e.what());
  }
  c.weight_init = model.String("init", "auto");
  if (c.weight_init != "auto" && c.weight_init != "he_normal" && c.weight_init != "uniform")
    model.Fail("init", "expected \"auto\", \"he_normal\" or \"uniform\", got \"" + c.weight_init + "\"");
  ReadLossScale(model, &c);

  SectionReader data(file, root, "data",
                     {"format",
                      "train",
                      "test",
                      "batch_size",
                      "synthetic_samples",
                      "image_size",
                      "classes",
                      "max_train_samples",
                      "max_test_samples",
                      "augment",
                      "label",
                      "channels",
                      "mean",
                      "std",
                      "crop_fraction",
                      "skip_bad",
                      "shuffle_buffer",
                      "loader_threads",
                      "test_cache_mb",
                      "seq_len",
                      "vocab_size"});
  c.data_format = data.String("format", "idx");
  if (c.data_format != "idx" && c.data_format != "cifar" && c.data_format != "cifar100" &&
      c.data_format != "synthetic" && c.data_format != "imagefolder" && c.data_format != "webdataset" &&
      c.data_format != "tokens")
    data.Fail("format",
              "expected \"idx\", \"cifar\", \"cifar100\", \"synthetic\", \"imagefolder\", \"webdataset\" or "
              "\"tokens\", got \"" +
                  c.data_format + "\"");
  const bool tokens = c.data_format == "tokens";
  // A token window has no pixels and no classes: these keys would be silently ignored.
  for (const char* k : {"augment", "mean", "std", "classes", "image_size"})
    if (data.Get(k) && tokens) data.Fail(k, "format = \"tokens\" does not take it");
  for (const char* k : {"seq_len", "vocab_size"})
    if (data.Get(k) && !tokens) data.Fail(k, "only format = \"tokens\" takes it (format is \"" + c.data_format + "\")");
  if (tokens) {
    if (!data.Get("seq_len")) data.Fail("seq_len", "missing: format = \"tokens\" needs the window length in tokens");
    if (!data.Get("vocab_size"))
      data.Fail("vocab_size",
                "missing: format = \"tokens\" needs the model's output size (every token id is below it)");
    c.seq_len = data.Int("seq_len", 0, 1, 1 << 20);
    c.vocab_size = data.Int("vocab_size", 0, 2, 65536);  // uint16 ids: at most 65536 distinct
  }
  const bool encoded = c.data_format == "imagefolder" || c.data_format == "webdataset";
  // Keys of the encoded-image formats only: elsewhere they would be silently ignored.
  for (const char* k : {"crop_fraction", "test_cache_mb"})
    if (data.Get(k) && !encoded)
      data.Fail(k, "only format = \"imagefolder\" or \"webdataset\" takes it (format is \"" + c.data_format + "\")");
  if (data.Get("channels") && !encoded && c.data_format != "synthetic")
    data.Fail("channels", "only format = \"imagefolder\", \"webdataset\" or \"synthetic\" takes it (format is \"" +
                              c.data_format + "\")");
  if (data.Get("skip_bad") && !encoded && !tokens)
    data.Fail("skip_bad", "only format = \"imagefolder\", \"webdataset\" or \"tokens\" takes it (format is \"" +
                              c.data_format + "\")");
  if (data.Get("shuffle_buffer") && c.data_format != "webdataset")
    data.Fail("shuffle_buffer", "only format = \"webdataset\" takes it (format is \"" + c.data_format + "\")");
  c.data_label = data.String("label", "fine");
  // Only CIFAR-100 records carry two labels; elsewhere the key would be silently ignored.
  if (data.Get("label") && c.data_format != "cifar100")
    data.Fail("label", "only format = \"cifar100\" has a choice of labels (format is \"" + c.data_format + "\")");
  if (c.data_label != "fine" && c.data_label != "coarse")
    data.Fail("label", "expected \"fine\" (100 classes) or \"coarse\" (20 superclasses), got \"" + c.data_label + "\"");
  bool needs_files = c.data_format != "synthetic";
  c.train_path = data.String("train", "", needs_files);
  c.test_path = data.String("test", "", needs_files);
  c.batch_size = data.Int("batch_size", 64, 1, kMaxBatchSize);
  c.synthetic_samples = data.Int("synthetic_samples", 1024, 1, kMaxSamples);
  c.synthetic_image_size = data.Int("image_size", 224, 8, 4096);
  c.synthetic_classes = data.Int("classes", 1000, 2, 1 << 20);
  if (c.data_format != "synthetic") c.data_classes = data.Int("classes", 0, 2, 1 << 20);
  if (tokens) c.data_classes = c.vocab_size;
  c.max_train_samples = data.Int("max_train_samples", 0, 0, INT64_MAX);
  c.max_test_samples = data.Int("max_test_samples", 0, 0, INT64_MAX);
  c.augment = data.Bool("augment", encoded);
  c.data_channels = data.Int("channels", 3, 1, 3);
  if (c.data_channels == 2) data.Fail("channels", "expected 1 (grayscale) or 3 (RGB), got 2");
  c.crop_fraction = data.Double("crop_fraction", 0.875, 0.05, 1.0);
  c.skip_bad = data.Bool("skip_bad", false);
  c.shuffle_buffer = data.Int("shuffle_buffer", 1000, 1, 1 << 24);
  c.loader_threads = data.Int("loader_threads", 0, 0, kMaxThreads);
  c.test_cache_mb = data.Int("test_cache_mb", 1024, 0, int64_t(1) << 30);
  for (auto [key, out] : {std::make_pair("mean", &c.data_mean), std::make_pair("std", &c.data_std)}) {
    const toml::node* n = data.Get(key);
    if (!n) continue;
    const toml::array* a = n->as_array();
    if (!a || a->empty())
      data.Fail(key, std::string("expected an array of numbers, one per channel, got ") + Describe(n));
    for (auto& e : *a) {
      if (!e.is_number()) data.Fail(key, "expected numbers, got " + Describe(&e));
      const double v = *e.value<double>();
      if (!std::isfinite(v) || (std::string(key) == "std" ? v <= 0 : false))
        data.Fail(key, std::string(key) == "std" ? "expected positive finite numbers" : "expected finite numbers");
      out->push_back(v);
    }
  }
  if (!c.data_mean.empty() && !c.data_std.empty() && c.data_mean.size() != c.data_std.size())
    data.Fail("std", std::to_string(c.data_std.size()) + " values but mean has " + std::to_string(c.data_mean.size()));
  if (encoded)
    for (auto [key, v] : {std::make_pair("mean", &c.data_mean), std::make_pair("std", &c.data_std)})
      if (!v->empty() && int64_t(v->size()) != c.data_channels)
        data.Fail(key, std::to_string(v->size()) + " values for " + std::to_string(c.data_channels) + " channel(s)");

  c.algorithm_opts = ReadFreeSection(file, root, "algorithm", &c.algorithm, "local");
  c.optimizer_opts = ReadFreeSection(file, root, "optimizer", &c.optimizer, "momentum");

  SectionReader train(
      file, root, "train",
      {"epochs", "target_accuracy", "max_steps", "threads", "log_every_steps", "eval_every_steps", "batch_schedule"});
  c.epochs = train.Int("epochs", 1, 1, kMaxEpochs);
  c.target_accuracy = train.Double("target_accuracy", 0.0, 0.0, 1.0);
  c.max_steps = train.Int("max_steps", 0, 0, INT64_MAX);
  c.threads = train.Int("threads", 0, 0, kMaxThreads);
  c.log_every_steps = train.Int("log_every_steps", 50, 1, INT64_MAX);
  c.eval_every_steps = train.Int("eval_every_steps", 0, 0, INT64_MAX);
  if (const toml::node* n = train.Get("batch_schedule")) {
    const toml::array* a = n->as_array();
    const std::string expected =
        "expected an array of [epoch, global batch] pairs such as [[0, 4096], [10, 8192]], got ";
    if (!a || a->empty()) train.Fail("batch_schedule", expected + Describe(n));
    for (size_t i = 0; i < a->size(); ++i) {
      const toml::array* pair = (*a)[i].as_array();
      if (!pair || pair->size() != 2 || !(*pair)[0].is_integer() || !(*pair)[1].is_integer())
        train.Fail("batch_schedule", "stage " + std::to_string(i) + ": " + expected + Describe(&(*a)[i]));
      c.batch_schedule.push_back({*(*pair)[0].value<int64_t>(), *(*pair)[1].value<int64_t>()});
    }
    // The workers' share of the first stage, unless the file says it (CheckJobLimits checks it agrees).
    if (!data.Get("batch_size") && c.batch_schedule[0].global_batch > 0)
      c.batch_size = std::max<int64_t>(1, c.batch_schedule[0].global_batch / std::max<int64_t>(1, c.world_size()));
  }
  CheckJobLimits(c);
  return c;
}

JobConfig LoadJobConfig(const std::string& path) {
  struct stat st;
  // A directory opens and reads as empty on Linux, which would read as "[job] name: missing".
  if (stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) throw Error(path + ": is a directory, not a job file");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(path + ": cannot open job file");
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) throw Error(path + ": cannot read job file");
  return ParseJobConfig(ss.str(), path);
}

bool IsPort(const std::string& s) {
  if (s.empty() || s.size() > 5 || s.find_first_not_of("0123456789") != std::string::npos) return false;
  const int port = std::stoi(s);  // at most 5 digits: no overflow
  return port >= 1 && port <= 65535;
}

}  // namespace shoal
