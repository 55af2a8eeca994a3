# Sourced by the bundle tests: the one small job they both run from an unpacked bundle (a
# tiny mlp on synthetic data, a few steps of allreduce), so the two cannot drift apart.
# mlp_job FILE OUTPUT_DIR WORKERS writes it to FILE.
mlp_job() {
  cat > "$1" <<JOB
[job]
name = "bundle-mlp"
output_dir = "$2"
[cluster]
workers = $3
[model]
name = "mlp"
[data]
format = "synthetic"
batch_size = 16
synthetic_samples = 64
image_size = 8
classes = 4
[algorithm]
name = "allreduce"
[optimizer]
name = "sgd"
lr = 0.05
[train]
epochs = 1
threads = 1
JOB
}
