#include <gtest/gtest.h>

#include "common/config.h"
#include "common/error.h"

namespace shoal {
namespace {

const char* kGood = R"(
[job]
name = "fmnist-bmuf"
seed = 7
output_dir = "runs/x"
checkpoint_every_steps = 500
[cluster]
servers = ["127.0.0.1:7701", "127.0.0.1:7702"]
workers = 4
[model]
name = "lenet"
[data]
format = "idx"
train = "/usr/share/datasets/fashion-mnist/train"
test = "/usr/share/datasets/fashion-mnist/t10k"
batch_size = 64
[algorithm]
name = "bmuf"
block_steps = 8
block_momentum = 0.9
[optimizer]
name = "momentum"
lr = 0.05
nesterov = true
[train]
epochs = 10
target_accuracy = 0.90
)";

std::string ErrorOf(const std::string& text) {
  try {
    ParseJobConfig(text, "job.toml");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

std::string Replace(std::string s, const std::string& from, const std::string& to) {
  auto p = s.find(from);
  EXPECT_NE(p, std::string::npos) << from;
  return s.replace(p, from.size(), to);
}

// CIFAR-100's two labels: fine by default, coarse on request; the key means nothing to the
// other formats, so naming it there is an error rather than silently ignored.
TEST(Config, Cifar100Label) {
  const std::string cifar = Replace(kGood, "format = \"idx\"", "format = \"cifar100\"");
  EXPECT_EQ(ParseJobConfig(cifar, "job.toml").data_label, "fine");
  EXPECT_EQ(ParseJobConfig(Replace(cifar, "batch_size = 64", "label = \"coarse\""), "job.toml").data_label, "coarse");
  EXPECT_NE(ErrorOf(Replace(cifar, "batch_size = 64", "label = \"medium\""))
                .find("job.toml: [data] label: expected \"fine\" (100 classes) or \"coarse\" (20 superclasses), got "
                      "\"medium\""),
            std::string::npos);
  EXPECT_NE(ErrorOf(Replace(kGood, "batch_size = 64", "label = \"coarse\""))
                .find("job.toml: [data] label: only format = \"cifar100\" has a choice of labels (format is \"idx\")"),
            std::string::npos);
}

// The encoded-image keys: defaults, ranges, and keys a format would ignore are errors.
TEST(Config, ImageDataKeys) {
  const std::string folder = Replace(kGood, "format = \"idx\"", "format = \"imagefolder\"");
  JobConfig c = ParseJobConfig(folder, "job.toml");
  EXPECT_EQ(c.data_format, "imagefolder");
  EXPECT_TRUE(c.augment);  // on by default for photos, off for idx/cifar
  EXPECT_FALSE(ParseJobConfig(kGood, "job.toml").augment);
  EXPECT_EQ(c.data_channels, 3);
  EXPECT_EQ(c.synthetic_image_size, 224);
  EXPECT_DOUBLE_EQ(c.crop_fraction, 0.875);
  EXPECT_FALSE(c.skip_bad);
  EXPECT_EQ(c.test_cache_mb, 1024);
  c = ParseJobConfig(
      Replace(folder, "batch_size = 64",
              "channels = 1\nmean = [0.5]\nstd = [0.25]\nskip_bad = true\nloader_threads = 3\ntest_cache_mb = 0"),
      "job.toml");
  EXPECT_EQ(c.test_cache_mb, 0);
  EXPECT_EQ(c.data_channels, 1);
  EXPECT_EQ(c.data_mean, std::vector<double>{0.5});
  EXPECT_EQ(c.data_std, std::vector<double>{0.25});
  EXPECT_TRUE(c.skip_bad);
  EXPECT_EQ(c.loader_threads, 3);
  auto error = [&](const std::string& base, const std::string& line) {
    return ErrorOf(Replace(base, "batch_size = 64", line));
  };
  EXPECT_EQ(error(folder, "channels = 2"), "job.toml: [data] channels: expected 1 (grayscale) or 3 (RGB), got 2");
  EXPECT_EQ(error(folder, "mean = [0.5]"), "job.toml: [data] mean: 1 values for 3 channel(s)");
  EXPECT_EQ(error(folder, "std = [1, 0, 1]"), "job.toml: [data] std: expected positive finite numbers");
  EXPECT_EQ(error(folder, "mean = \"imagenet\""),
            "job.toml: [data] mean: expected an array of numbers, one per channel, got string \"imagenet\"");
  EXPECT_EQ(
      error(kGood, "skip_bad = true"),
      "job.toml: [data] skip_bad: only format = \"imagefolder\", \"webdataset\" or \"tokens\" takes it (format is "
      "\"idx\")");
  EXPECT_EQ(error(kGood, "test_cache_mb = 10"),
            "job.toml: [data] test_cache_mb: only format = \"imagefolder\" or \"webdataset\" takes it (format is "
            "\"idx\")");
  EXPECT_EQ(error(kGood, "channels = 1"),
            "job.toml: [data] channels: only format = \"imagefolder\", \"webdataset\" or \"synthetic\" takes it "
            "(format is \"idx\")");
  // Synthetic images as grayscale: the shape of a 1-channel model (an ONNX export, say).
  EXPECT_EQ(ParseJobConfig(Replace(kGood, "format = \"idx\"", "format = \"synthetic\"\nchannels = 1"), "job.toml")
                .data_channels,
            1);
  EXPECT_EQ(error(folder, "shuffle_buffer = 10"),
            "job.toml: [data] shuffle_buffer: only format = \"webdataset\" takes it (format is \"imagefolder\")");
  EXPECT_NE(error(folder, "crop_fraction = 1.5").find("job.toml: [data] crop_fraction: expected a number in"),
            std::string::npos);
  // mean/std apply to every format (an IDX set's own statistics by default).
  EXPECT_EQ(ParseJobConfig(Replace(kGood, "batch_size = 64", "mean = [0.3]"), "job.toml").data_mean,
            std::vector<double>{0.3});
}

// Token files: seq_len and vocab_size are required there and refused elsewhere, and the
// image keys a token window would ignore are errors.
TEST(Config, TokenKeys) {
  const std::string tok = Replace(kGood, "format = \"idx\"", "format = \"tokens\"");
  JobConfig c = ParseJobConfig(Replace(tok, "batch_size = 64", "seq_len = 256\nvocab_size = 50304"), "job.toml");
  EXPECT_EQ(c.data_format, "tokens");
  EXPECT_EQ(c.seq_len, 256);
  EXPECT_EQ(c.vocab_size, 50304);
  EXPECT_EQ(c.data_classes, 50304);  // the model's output size
  EXPECT_FALSE(c.augment);
  auto error = [&](const std::string& base, const std::string& line) {
    return ErrorOf(Replace(base, "batch_size = 64", line));
  };
  EXPECT_EQ(error(tok, "vocab_size = 256"),
            "job.toml: [data] seq_len: missing: format = \"tokens\" needs the window length in tokens");
  EXPECT_NE(error(tok, "seq_len = 8").find("job.toml: [data] vocab_size: missing"), std::string::npos);
  EXPECT_NE(error(tok, "seq_len = 8\nvocab_size = 70000").find("job.toml: [data] vocab_size: expected an integer"),
            std::string::npos);
  EXPECT_EQ(error(tok, "seq_len = 8\nvocab_size = 256\naugment = true"),
            "job.toml: [data] augment: format = \"tokens\" does not take it");
  EXPECT_EQ(error(kGood, "seq_len = 8"),
            "job.toml: [data] seq_len: only format = \"tokens\" takes it (format is \"idx\")");
}

TEST(Config, ParsesTheDesignExample) {
  JobConfig c = ParseJobConfig(kGood, "job.toml");
  EXPECT_EQ(c.name, "fmnist-bmuf");
  EXPECT_EQ(c.seed, 7u);
  EXPECT_EQ(c.servers.size(), 2u);
  EXPECT_EQ(c.world_size(), 4);
  EXPECT_EQ(c.workers[3].device, "cpu");
  EXPECT_EQ(c.model, "lenet");
  EXPECT_EQ(c.batch_size, 64);
  EXPECT_EQ(c.algorithm, "bmuf");
  EXPECT_EQ(c.algorithm_opts.GetInt("block_steps", 1), 8);
  EXPECT_DOUBLE_EQ(c.algorithm_opts.GetDouble("block_momentum", 0), 0.9);
  EXPECT_TRUE(c.optimizer_opts.GetBool("nesterov", false));
  EXPECT_DOUBLE_EQ(c.optimizer_opts.GetDouble("lr", 0), 0.05);
  EXPECT_DOUBLE_EQ(c.target_accuracy, 0.9);
}

TEST(Config, WorkerTables) {
  auto c = ParseJobConfig(
      Replace(kGood, "workers = 4", "workers = [{device = \"cuda:1\", slowdown = 4.0}, {host = \"10.0.0.2\"}]") +
          "[security]\nallow_plaintext = true\n",
      "job.toml");
  ASSERT_EQ(c.world_size(), 2);
  EXPECT_EQ(c.workers[0].device, "cuda:1");
  EXPECT_DOUBLE_EQ(c.workers[0].slowdown, 4.0);
  EXPECT_EQ(c.workers[1].host, "10.0.0.2");
}

// cpu_quota: cores of CPU time per worker (`shoal run` gives each its own cgroup); one
// table per worker, so the list's length is the worker count.
TEST(Config, WorkerCpuQuota) {
  auto c = ParseJobConfig(
      Replace(kGood, "workers = 4", "workers = [{cpu_quota = 0.45}, {cpu_quota = 0.45}, {cpu_quota = 2}, {}]"),
      "job.toml");
  ASSERT_EQ(c.world_size(), 4);
  EXPECT_DOUBLE_EQ(c.workers[0].cpu_quota, 0.45);
  EXPECT_DOUBLE_EQ(c.workers[2].cpu_quota, 2.0);
  EXPECT_DOUBLE_EQ(c.workers[3].cpu_quota, 0.0);  // no limit
  EXPECT_DOUBLE_EQ(ParseJobConfig(kGood, "job.toml").workers[0].cpu_quota, 0.0);
  auto workers = [](const std::string& table) { return ErrorOf(Replace(kGood, "workers = 4", "workers = " + table)); };
  for (const char* bad : {"0", "-0.5", "0.001", "2000.0", "\"half\"", "true"})
    EXPECT_NE(workers(std::string("[{}, {cpu_quota = ") + bad + "}]")
                  .find("job.toml: [cluster] workers[1] cpu_quota: unexpected"),
              std::string::npos)
        << bad;
  EXPECT_NE(workers("[{cpu_quota = 0}]").find("cpu_quota 0.01-1024 cores"), std::string::npos);
}

TEST(Config, StatusPageKeys) {
  JobConfig d = ParseJobConfig(kGood, "job.toml");
  EXPECT_EQ(d.status_port, 0);  // a free port, picked when the job starts
  EXPECT_EQ(d.status_bind, "127.0.0.1");
  EXPECT_DOUBLE_EQ(d.straggler_ratio, 1.5);
  JobConfig c = ParseJobConfig(
      Replace(kGood, "seed = 7", "seed = 7\nstatus_port = 8123\nstatus_bind = \"0.0.0.0\"\nstraggler_ratio = 2.5") +
          "[security]\nallow_plaintext = true\n",  // a status page off loopback needs consent
      "job.toml");
  EXPECT_EQ(c.status_port, 8123);
  EXPECT_EQ(c.status_bind, "0.0.0.0");
  EXPECT_DOUBLE_EQ(c.straggler_ratio, 2.5);
  EXPECT_EQ(ErrorOf(Replace(kGood, "seed = 7", "seed = 7\nstatus_port = 70000")),
            "job.toml: [job] status_port: expected an integer in [0, 65535], got 70000");
  EXPECT_EQ(ErrorOf(Replace(kGood, "seed = 7", "seed = 7\nstatus_port = \"8080\"")),
            "job.toml: [job] status_port: expected an integer in [0, 65535], got string \"8080\"");
  EXPECT_NE(ErrorOf(Replace(kGood, "seed = 7", "seed = 7\nstatus_bind = \"localhost:80\""))
                .find("job.toml: [job] status_bind: expected an IPv4 address"),
            std::string::npos);
  EXPECT_EQ(ErrorOf(Replace(kGood, "seed = 7", "seed = 7\nstraggler_ratio = 1.0")),
            "job.toml: [job] straggler_ratio: expected a number in [1.05, 1000], got 1");
}

TEST(Config, ExportKeys) {
  JobConfig c = ParseJobConfig(
      Replace(kGood, "seed = 7", "seed = 7\nexport_weights = \"w.bin\"\nexport_onnx = \"model.onnx\""), "job.toml");
  EXPECT_EQ(c.export_weights, "w.bin");
  EXPECT_EQ(c.export_onnx, "model.onnx");
  EXPECT_EQ(ParseJobConfig(kGood, "job.toml").export_onnx, "");
  EXPECT_EQ(ErrorOf(Replace(kGood, "seed = 7", "seed = 7\nexport_weights = \"m\"\nexport_onnx = \"m\"")),
            "job.toml: [job] export_onnx: \"m\" is export_weights' file too; give each its own");
}

// Found by hand: slowdown = 1e300 overflowed the sleep's nanosecond count and ran at full
// speed, a bandwidth of 1e-30 Mbit/s did the same to the rate limiter's wait, and
// output_dir = "" wrote logs/, metrics.jsonl and plot.png to the filesystem root.
TEST(Config, WorkerSleepsAndOutputDirAreBounded) {
  auto workers = [](const std::string& table) { return ErrorOf(Replace(kGood, "workers = 4", "workers = " + table)); };
  EXPECT_NE(workers("[{slowdown = 1e300}]").find("job.toml: [cluster] workers[0] slowdown: unexpected float 1e+300"),
            std::string::npos);
  EXPECT_NE(workers("[{}, {bandwidth_mbps = 1e-30}]").find("workers[1] bandwidth_mbps: unexpected float 1e-30"),
            std::string::npos);
  EXPECT_NE(workers("[{bandwidth_mbps = 1e300}]").find("bandwidth_mbps"), std::string::npos);
  EXPECT_EQ(workers("[{slowdown = 1000.0, bandwidth_mbps = 0.01}, {bandwidth_mbps = 0}]"), "");
  EXPECT_EQ(ErrorOf(Replace(kGood, "output_dir = \"runs/x\"", "output_dir = \"\"")),
            "job.toml: [job] output_dir: expected a directory, got \"\" (leave the key out for runs/<name>)");
}

TEST(Config, ErrorsNameFileKeyAndExpectation) {
  EXPECT_EQ(ErrorOf(Replace(kGood, "batch_size = 64", "batch_size = -3")),
            "job.toml: [data] batch_size: expected an integer in [1, 1048576], got -3");
  EXPECT_EQ(ErrorOf(Replace(kGood, "batch_size = 64", "batch_size = \"big\"")),
            "job.toml: [data] batch_size: expected an integer in [1, 1048576], got string \"big\"");
  EXPECT_NE(ErrorOf(Replace(kGood, "name = \"lenet\"", "name = \"vgg\""))
                .find("job.toml: [model] name: unknown model \"vgg\""),
            std::string::npos);
  EXPECT_NE(ErrorOf(Replace(kGood, "epochs = 10", "epochz = 10")).find("job.toml: [train] epochz: unknown key"),
            std::string::npos);
  EXPECT_NE(ErrorOf(Replace(kGood, "127.0.0.1:7702", "127.0.0.1:99999"))
                .find("job.toml: [cluster] servers[1]: expected \"host:port\""),
            std::string::npos);
  // A port too long for a long once escaped as std::out_of_range (found by the fuzzer).
  EXPECT_NE(ErrorOf(Replace(kGood, "127.0.0.1:7702", "127.0.0.1:999999999999999999999999"))
                .find("job.toml: [cluster] servers[1]: expected \"host:port\""),
            std::string::npos);
  EXPECT_NE(ErrorOf(Replace(kGood, "format = \"idx\"", "format = \"csv\"")).find("[data] format"), std::string::npos);
  EXPECT_NE(ErrorOf(Replace(kGood, "[job]", "[jobb]")).find("unknown section [jobb]"), std::string::npos);
  EXPECT_NE(ErrorOf(Replace(kGood, "name = \"fmnist-bmuf\"", "")).find("[job] name: missing"), std::string::npos);
  EXPECT_NE(ErrorOf(Replace(kGood, "target_accuracy = 0.90", "target_accuracy = 1.5"))
                .find("[train] target_accuracy: expected a number in [0, 1], got 1.5"),
            std::string::npos);
  EXPECT_NE(ErrorOf(Replace(kGood, "workers = 4", "workers = [{device = \"tpu\"}]")).find("workers[0] device"),
            std::string::npos);
  EXPECT_NE(ErrorOf(Replace(kGood, "workers = 4", "workers = 0")).find("[cluster] workers"), std::string::npos);
  EXPECT_NE(ErrorOf(Replace(kGood, "name = \"lenet\"", "name = \"lenet\"\nprecision = \"fp8\""))
                .find("[model] precision: expected \"fp32\", \"tf32\", \"bf16\" or \"fp16\", got \"fp8\""),
            std::string::npos);
  EXPECT_NE(ErrorOf(Replace(kGood, "name = \"lenet\"", "name = \"lenet\"\ninit = \"xavier\""))
                .find("[model] init: expected \"auto\", \"he_normal\" or \"uniform\", got \"xavier\""),
            std::string::npos);
}

// [model] loss_scale: its default follows precision, a number is a fixed scale, and the
// dynamic scaler's keys are refused where nothing reads them.
TEST(Config, LossScale) {
  auto with = [](const std::string& keys) {
    return ParseJobConfig(Replace(kGood, "name = \"lenet\"", "name = \"lenet\"\n" + keys), "job.toml");
  };
  JobConfig c = with("");
  EXPECT_EQ(c.loss_scale, "none");
  c = with("precision = \"fp16\"");
  EXPECT_EQ(c.loss_scale, "dynamic");
  EXPECT_EQ(c.loss_scale_init, 65536.0);
  EXPECT_EQ(c.loss_scale_growth_interval, 2000);
  c = with("precision = \"fp16\"\nloss_scale = \"none\"");
  EXPECT_EQ(c.loss_scale, "none");
  c = with("loss_scale = 1024");
  EXPECT_EQ(c.loss_scale, "fixed");
  EXPECT_EQ(c.loss_scale_init, 1024.0);
  c = with("loss_scale = \"dynamic\"\nloss_scale_init = 8.5e37\nloss_scale_growth_interval = 10");
  EXPECT_EQ(c.loss_scale, "dynamic");
  EXPECT_EQ(c.loss_scale_init, 8.5e37);
  EXPECT_EQ(c.loss_scale_growth_interval, 10);

  auto error = [&](const std::string& keys) {
    return ErrorOf(Replace(kGood, "name = \"lenet\"", "name = \"lenet\"\n" + keys));
  };
  EXPECT_NE(error("loss_scale = \"auto\"")
                .find("[model] loss_scale: expected \"dynamic\", \"none\" or a number in "
                      "(0, 8.50706e+37 = 2^126], got \"auto\""),
            std::string::npos)
      << error("loss_scale = \"auto\"");
  EXPECT_NE(error("loss_scale = 0").find("[model] loss_scale: expected"), std::string::npos);
  EXPECT_NE(error("loss_scale = -4").find("got -4"), std::string::npos);
  EXPECT_NE(error("loss_scale = 1e39").find("got 1e+39"), std::string::npos);
  EXPECT_NE(error("loss_scale = true").find("[model] loss_scale: expected"), std::string::npos);
  EXPECT_NE(
      error("loss_scale = 1024\nloss_scale_init = 2")
          .find("[model] loss_scale_init: only used with loss_scale = \"dynamic\" (loss_scale is a fixed number)"),
      std::string::npos);
  EXPECT_NE(error("loss_scale_growth_interval = 5")
                .find("[model] loss_scale_growth_interval: only used with loss_scale = \"dynamic\" (loss_scale is "
                      "\"none\")"),
            std::string::npos);
  EXPECT_NE(error("loss_scale = \"dynamic\"\nloss_scale_init = 0")
                .find("[model] loss_scale_init: expected a number in (0, 1e+300], got 0"),
            std::string::npos);
  EXPECT_NE(
      error("loss_scale = \"dynamic\"\nloss_scale_init = 1e301").find("[model] loss_scale_init: expected a number"),
      std::string::npos);
  EXPECT_EQ(with("loss_scale = \"dynamic\"\nloss_scale_init = 1e42").loss_scale_init,
            1e42);  // beyond fp32: skips first
  EXPECT_NE(error("loss_scale = \"dynamic\"\nloss_scale_growth_interval = 0")
                .find("[model] loss_scale_growth_interval: expected an integer in [1, "),
            std::string::npos);
}

TEST(Config, SyntaxErrorsGiveLineAndColumn) {
  std::string e = ErrorOf("[job]\nname = \"x\"\nseed = = 3\n");
  EXPECT_EQ(e.rfind("job.toml:3:", 0), 0u) << e;
  EXPECT_NE(e.find("TOML syntax error"), std::string::npos);
}

TEST(Config, GarbageBytesAreAnErrorNotACrash) {
  std::string junk;
  for (int i = 0; i < 4096; ++i) junk += char((i * 131 + 7) % 256);
  EXPECT_FALSE(ErrorOf(junk).empty());
  EXPECT_FALSE(ErrorOf(std::string("\0\0\0", 3)).empty());
}

// Found by tests/fuzz/config_fuzzer: toml++ 3.3 aborted on an assertion for a control
// character (NUL, 0x02, ...) at the start of a table header's key.
TEST(Config, ControlCharactersAreAnErrorNotAnAbort) {
  const char header[] = "[job]\nname = \"x\"\n[\0ndata]\nformat = \"synthetic\"\n";
  EXPECT_EQ(ErrorOf(std::string(header, sizeof(header) - 1)),
            "job.toml:3:2: control character 0x00 (TOML allows only tab and line breaks)");
  const char key[] = "[job]\nna\0me = 1\n";
  EXPECT_EQ(ErrorOf(std::string(key, sizeof(key) - 1)),
            "job.toml:2:3: control character 0x00 (TOML allows only tab and line breaks)");
  EXPECT_EQ(ErrorOf("[\x02ob]\nname = 3\n"),
            "job.toml:1:2: control character 0x02 (TOML allows only tab and line breaks)");
  // Tabs and CRLF line ends stay fine.
  EXPECT_EQ(ErrorOf("[job]\r\n\tname = \"x\"\r\n").find("control character"), std::string::npos);
}

// Found by tests/fuzz/config_fuzzer: toml++ 3.3 asserted on a table header whose name
// starts with a character no key starts with, and hit "unreachable" on some non-ASCII
// characters in a bare key.
TEST(Config, InputsThatTrippedTomlPlusPlusAreErrorsNotAborts) {
  EXPECT_EQ(ErrorOf("[job]\nname = \"x\"\n[= 1[job]\n"),
            "job.toml:3:2: TOML syntax error: a table header must start with a name (letters, digits, _ or -) or a "
            "quoted key");
  EXPECT_NE(ErrorOf("[ [ \xc3\xa9t\xc3\xa9]]\n").find("job.toml:1:5: TOML syntax error: a table header"),
            std::string::npos);
  EXPECT_NE(ErrorOf("[\n").find("job.toml:1:2: TOML syntax error: a table header"), std::string::npos);
  EXPECT_EQ(ErrorOf("[job]\ne\xd1\xbb = 1\n"),
            "job.toml:2:2: TOML syntax error: non-ASCII character outside a string or comment (a bare key is "
            "letters, digits, _ and -)");
  EXPECT_EQ(ErrorOf("[job]\nname = \"\xff\"\n"), "job.toml:2:9: invalid UTF-8");
  EXPECT_EQ(ErrorOf("[job]\nx = [1, # c\n }\n"),
            "job.toml:3:2: TOML syntax error: '}' where an array value or ']' belongs");
  EXPECT_EQ(ErrorOf("x = {a = [}\n"), "job.toml:1:11: TOML syntax error: '}' where an array value or ']' belongs");
  // Non-ASCII text in strings, quoted keys and comments keeps its meaning.
  for (const char* v : {"'caf\xc3\xa9 \\ \"q\" \xd1\xbb'", "\"caf\xc3\xa9 \\\\ \\\"q\\\" \xd1\xbb\"",
                        "\"\"\"\ncaf\xc3\xa9 \\\\ \"q\" \xd1\xbb\"\"\"", "'''caf\xc3\xa9 \\ \"q\" \xd1\xbb'''"}) {
    auto c = ParseJobConfig(
        Replace(kGood, "output_dir = \"runs/x\"", std::string("output_dir = ") + v + " # \xf0\x9f\x90\x9f"),
        "job.toml");
    EXPECT_EQ(c.output_dir, "caf\xc3\xa9 \\ \"q\" \xd1\xbb") << v;
  }
  EXPECT_EQ(ErrorOf("# caf\xc3\xa9\n[job]\nname = \"caf\xc3\xa9\"\n\"\xd1\xbb\" = 1\n").find("TOML syntax"),
            std::string::npos);
  // Lines that start with '[' inside arrays and multi-line strings are values, not headers.
  std::string ok = std::string(kGood) +
                   "matrix = [\n[+1, 2],\n[{a = 1}],\n]\n"
                   "text = \"\"\"\n[= not a header\\\"\"\"\"\"\n"
                   "lit = '''\n[# nor this'''\n";
  EXPECT_EQ(ErrorOf(ok).find("table header"), std::string::npos) << ErrorOf(ok);
}

TEST(Config, MissingFile) {
  try {
    LoadJobConfig("/nonexistent/job.toml");
    FAIL();
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "/nonexistent/job.toml: cannot open job file");
  }
  try {
    LoadJobConfig("/tmp");  // opens and reads as empty: it must not read as a job missing [job] name
    FAIL();
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "/tmp: is a directory, not a job file");
  }
}

TEST(Config, SectionGettersCheckTypesAndRanges) {
  auto c = ParseJobConfig(kGood, "job.toml");
  EXPECT_THROW(c.algorithm_opts.GetBool("block_steps", false), Error);
  try {
    c.algorithm_opts.GetDouble("block_momentum", 0, 0, 0.5);
    FAIL();
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "job.toml: [algorithm] block_momentum: expected a number in [0, 0.5], got 0.9");
  }
}

}  // namespace
}  // namespace shoal

namespace shoal {
namespace {

std::string Job(const std::string& cluster, const std::string& security = "") {
  return "[job]\nname = \"p\"\n[cluster]\n" + cluster + "\n[data]\nformat = \"synthetic\"\n" + security;
}
const std::string kFakeKeys = "[security]\nserver_public_key = \"" + std::string(40, 'a') +
                              "\"\nserver_secret_key = \"" + std::string(40, 'b') + "\"\nclient_public_key = \"" +
                              std::string(40, 'c') + "\"\nclient_secret_key = \"" + std::string(40, 'd') + "\"\n";

TEST(PlaintextPolicy, AnAddressOffThisMachineNeedsKeysOrConsent) {
  std::string e = ErrorOf(Job("servers = [\"127.0.0.1:7000\", \"10.0.0.5:7001\"]\nworkers = 2"));
  EXPECT_NE(e.find("[cluster] servers[1] = \"10.0.0.5:7001\" is not a loopback address"), std::string::npos) << e;
  EXPECT_NE(e.find("./shoal keygen"), std::string::npos) << e;
  EXPECT_NE(e.find("allow_plaintext = true"), std::string::npos) << e;
  e = ErrorOf(Job("workers = [{host = \"127.0.0.1\"}, {host = \"node07\"}]"));
  EXPECT_NE(e.find("[cluster] workers[1] host = \"node07\""), std::string::npos) << e;
  // Consent, or keys, and the same jobs load.
  EXPECT_EQ(ErrorOf(Job("servers = [\"10.0.0.5:7001\"]\nworkers = [{host = \"node07\"}]",
                        "[security]\nallow_plaintext = true\n")),
            "");
  EXPECT_EQ(ErrorOf(Job("servers = [\"10.0.0.5:7001\"]\nworkers = [{host = \"node07\"}]", kFakeKeys)), "");
  // Loopback in all its spellings needs neither.
  EXPECT_EQ(ErrorOf(Job("servers = [\"localhost:7000\", \"127.0.0.2:7001\"]\n"
                        "workers = [{host = \"localhost\"}, {host = \"127.0.0.1\"}]")),
            "");
}

TEST(PlaintextPolicy, AStatusPageOffLoopbackNeedsConsentEvenWithKeys) {
  std::string job =
      "[job]\nname = \"p\"\nstatus_bind = \"0.0.0.0\"\n[cluster]\nworkers = 1\n[data]\nformat = \"synthetic\"\n";
  // Keys encrypt the ZeroMQ traffic, not the page's HTTP: they do not let it leave loopback.
  for (const std::string& security : {std::string(), kFakeKeys}) {
    std::string e = ErrorOf(job + security);
    EXPECT_NE(e.find("[job] status_bind = \"0.0.0.0\" is not a loopback address"), std::string::npos) << e;
    EXPECT_NE(e.find("no CurveZMQ"), std::string::npos) << e;
    EXPECT_NE(e.find("ssh -L"), std::string::npos) << e;
    EXPECT_NE(e.find("allow_plaintext = true"), std::string::npos) << e;
  }
  EXPECT_EQ(ErrorOf(job + "[security]\nallow_plaintext = true\n"), "");
  // A loopback bind other than the default needs nothing.
  EXPECT_EQ(ErrorOf("[job]\nname = \"p\"\nstatus_bind = \"127.0.0.2\"\n[cluster]\nworkers = 1\n[data]\n"
                    "format = \"synthetic\"\n" +
                    kFakeKeys),
            "");
}

TEST(PlaintextPolicy, KeysComeAsAWholeSection) {
  std::string e = ErrorOf(Job("workers = 1", "[security]\nserver_public_key = \"" + std::string(40, 'a') + "\"\n"));
  EXPECT_NE(e.find("[security] server_secret_key"), std::string::npos) << e;
}

}  // namespace
}  // namespace shoal

namespace shoal {
namespace {

TEST(ConfigSection, NearestKeyFindsTyposAndInitialsOnly) {
  std::vector<std::string> known = {"lr", "momentum", "staleness", "warmup_epochs"};
  EXPECT_EQ(NearestKey("stalenes", known), "staleness");
  EXPECT_EQ(NearestKey("momentun", known), "momentum");
  EXPECT_EQ(NearestKey("learning_rate", known), "lr");
  EXPECT_EQ(NearestKey("warmup_epoch", known), "warmup_epochs");
  EXPECT_EQ(NearestKey("batch", known), "");
}

TEST(ConfigSection, CheckKeysNamesFileSectionKeyAndSuggestion) {
  ConfigSection s("job.toml", "optimizer");
  s.Set("lr", 0.1);
  EXPECT_NO_THROW(s.CheckKeys({"lr"}, "optimizer \"sgd\""));
  s.Set("momentun", 0.9);
  try {
    s.CheckKeys({"lr", "momentum"}, "optimizer \"momentum\"");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(),
                 "job.toml: [optimizer] momentun: unknown key for optimizer \"momentum\" (did you mean 'momentum'?)");
  }
}

}  // namespace
}  // namespace shoal

namespace shoal {
namespace {

// synthetic_samples x workers is formed by the trainer: a value that would wrap int64 (or
// make a data set no host holds) is refused at load, naming the key.
TEST(Config, SizeProductsCannotOverflow) {
  EXPECT_EQ(ErrorOf(Replace(kGood, "batch_size = 64", "batch_size = 64\nsynthetic_samples = 9223372036854775807")),
            "job.toml: [data] synthetic_samples: expected an integer in [1, 2147483648], got 9223372036854775807");
  EXPECT_EQ(ErrorOf(Replace(kGood, "batch_size = 64", "batch_size = 64\nsynthetic_samples = 1073741824")),
            "job.toml: [data] synthetic_samples: 1073741824 per worker x 4 workers = 4294967296 samples, more than the "
            "limit of 2147483648");
  EXPECT_EQ(ErrorOf(Replace(kGood, "batch_size = 64", "batch_size = 64\nsynthetic_samples = 536870912")), "");
  // Command-line overrides land after the load: the same check catches them.
  JobConfig c = ParseJobConfig(kGood, "job.toml");
  c.batch_size = int64_t(1) << 40;
  try {
    CheckJobLimits(c);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "job.toml: [data] batch_size: expected an integer in [1, 1048576], got 1099511627776");
  }
}

}  // namespace
}  // namespace shoal

namespace shoal {
namespace {

// [train] batch_schedule: parsed into stages, [data] batch_size taken from the first stage
// when left out, and every way it cannot run named with the file and the key.
TEST(Config, BatchSchedule) {
  const std::string base = Replace(kGood, "batch_size = 64\n", "");
  JobConfig c = ParseJobConfig(Replace(base, "epochs = 10",
                                       "epochs = 30\nbatch_schedule = [[0, 4096], [10, 8192], "
                                       "[25, 16384]]"),
                               "job.toml");
  ASSERT_EQ(c.batch_schedule.size(), 3u);
  EXPECT_EQ(c.batch_schedule[1].epoch, 10);
  EXPECT_EQ(c.batch_schedule[2].global_batch, 16384);
  EXPECT_EQ(c.batch_size, 1024);  // 4096 over 4 workers
  EXPECT_TRUE(ParseJobConfig(kGood, "job.toml").batch_schedule.empty());
  auto err = [&](const std::string& schedule, const std::string& text = "") {
    return ErrorOf(Replace(text.empty() ? base : text, "epochs = 10", "epochs = 30\nbatch_schedule = " + schedule));
  };
  EXPECT_EQ(err("[[0, 4096], [10, 8192]]", kGood),
            "job.toml: [data] batch_size = 64 disagrees with [train] batch_schedule, whose first stage gives each of "
            "the 4 workers 1024 (leave batch_size out with a schedule)");
  EXPECT_EQ(err("[[0, 256], [10, 8192]]", Replace(kGood, "batch_size = 64", "batch_size = 64 ")), "");
  EXPECT_EQ(err("[[1, 4096]]"),
            "job.toml: [train] batch_schedule: stage 0 [1, 4096]: the first stage must start at "
            "epoch 0");
  EXPECT_EQ(err("[[0, 4096], [10, 8192], [10, 16384]]"),
            "job.toml: [train] batch_schedule: stage 2 [10, 16384]: epochs must increase (the stage before starts at "
            "epoch 10)");
  EXPECT_EQ(err("[[0, 4096], [30, 8192]]"),
            "job.toml: [train] epochs = 30: [train] batch_schedule stage 1 [30, 8192]: starts after the last epoch "
            "(epochs count from 0)");
  EXPECT_EQ(err("[[0, 4096], [10, 8190]]"),
            "job.toml: [train] batch_schedule: stage 1 [10, 8190]: the global batch is not divisible by the job's 4 "
            "workers");
  EXPECT_NE(err("[[0, 4096], [10, -8]]").find("stage 1 [10, -8]: expected a global batch in [1, "), std::string::npos);
  EXPECT_NE(err("[]").find("[train] batch_schedule: expected an array of [epoch, global batch] pairs"),
            std::string::npos);
  EXPECT_NE(err("4096").find("[train] batch_schedule: expected an array"), std::string::npos);
  EXPECT_NE(err("[[0, 4096], [10]]")
                .find("[train] batch_schedule: stage 1: expected an array of [epoch, global "
                      "batch] pairs such as [[0, 4096], [10, 8192]], got"),
            std::string::npos);
  EXPECT_NE(err("[[0, 4096], [10, 8192.5]]").find("stage 1: expected"), std::string::npos);
  EXPECT_NE(err("[[0, 4096], [\"10\", 8192]]").find("stage 1: expected"), std::string::npos);
  // A flag that overrides the epochs is named as the user typed it.
  JobConfig ok =
      ParseJobConfig(Replace(base, "epochs = 10", "epochs = 30\nbatch_schedule = [[0, 4096], [20, 8192]]"), "job.toml");
  ok.epochs = 12;
  try {
    CheckJobLimits(ok, {{"[train] epochs", "--epochs"}});
    ADD_FAILURE() << "a stage after the last epoch was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "--epochs (overriding [train] epochs of the job file) = 12: [train] "
              "batch_schedule stage 1 [20, 8192]: starts after the last epoch (epochs count "
              "from 0)");
  }
}

}  // namespace
}  // namespace shoal
