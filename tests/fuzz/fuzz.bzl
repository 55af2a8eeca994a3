"""fuzz_target: one libFuzzer target's seed-corpus replay test (see BUILD)."""

def fuzz_target(name, deps):
    native.cc_test(
        name = name + "_corpus_test",
        size = "small",
        srcs = [name + "_fuzzer.cc", "replay_main.cc"],
        args = ["tests/fuzz/corpus/" + name],
        data = native.glob(["corpus/" + name + "/*"]),
        deps = deps + [":fuzz_util", "//common:error"],
    )
