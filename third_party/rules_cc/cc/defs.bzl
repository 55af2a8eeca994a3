# Stand-in for rules_cc: Debian's package is too new for bazel 4.2.3, the native rules suffice.
cc_binary = native.cc_binary
cc_library = native.cc_library
cc_test = native.cc_test
cc_import = native.cc_import
cc_proto_library = native.cc_proto_library
cc_toolchain = native.cc_toolchain
cc_toolchain_suite = native.cc_toolchain_suite
objc_library = native.objc_library
objc_import = native.objc_import
