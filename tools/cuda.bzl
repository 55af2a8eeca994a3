"""cuda_library: compiles .cu files with the toolkit's nvcc (sm_90 SASS + PTX) into a cc_library."""

NVCC = "/usr/local/cuda/bin/nvcc"

def cuda_library(name, srcs, hdrs = [], deps = [], nvcc_hdrs = [], **kwargs):
    """nvcc_hdrs: headers from other packages that the .cu files include (e.g. //common:dtype_bits.h)."""
    objs = []
    for src in srcs:
        obj = name + "_" + src.replace("/", "_").replace(".cu", ".o")
        native.genrule(
            name = obj + "_nvcc",
            srcs = [src] + [h for h in native.glob(["**/*.h", "**/*.cuh"], allow_empty = True) if h not in hdrs] + hdrs +
                   nvcc_hdrs,
            outs = [obj],
            # Each nvcc gets its own TMPDIR: parallel sandboxes share /tmp and clobber
            # each other's intermediate files otherwise.
            cmd = ("export TMPDIR=$$(mktemp -d); " + NVCC + " -std=c++17 -O3 -Xcompiler -fPIC -I. -I$(GENDIR)" +
                   " -gencode arch=compute_80,code=sm_80" +
                   " -gencode arch=compute_90,code=sm_90" +
                   " -gencode arch=compute_90,code=compute_90" +
                   " -c $(location " + src + ") -o $@; rc=$$?; rm -rf $$TMPDIR; exit $$rc"),
        )
        objs.append(obj)
    native.cc_library(
        name = name,
        srcs = objs,
        hdrs = hdrs,
        deps = deps + ["@cuda//:cuda_runtime"],
        **kwargs
    )
