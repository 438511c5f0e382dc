#!/bin/bash
# psd's GPU checks, run on a GPU machine from the bundle tests/gpu/bundle.sh
# made (.dev/): the CUDA suites against their CPU oracles, kernel_bench's
# lines, dworker --standalone on CPU and CUDA, and a sync deterministic CNN
# job of 2 shards and 2 dworkers on CUDA twice (the same accuracy both
# times). Writes its output to $OUT/gpu.log too when OUT is set.
D=$(cd "$(dirname "$0")" && pwd)
exec > >(tee "${OUT:-/tmp}/gpu.log") 2>&1
mkdir -p /tmp/psd && tar -C /tmp/psd -xJf "$D/libs.tar.xz"
mkdir -p /usr/share/datasets/fashion-mnist && cp "$D"/data/*.gz /usr/share/datasets/fashion-mnist/
CU=$(dirname "$(find /usr/local -name 'libcublas.so.*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH=/tmp/psd/libs:$CU
nvidia-smi -L
for b in "$D"/bin/*; do ldd "$b" | grep 'not found' && echo "check.sh: $b misses a library"; done
echo "== kernels-cuda"; timeout 150 "$D/bin/test-kernels-cuda"; echo "rc=$?"
echo "== model-cuda"; timeout 150 "$D/bin/test-model-cuda"; echo "rc=$?"
echo "== kernel_bench"; timeout 90 "$D/bin/kernel_bench"; echo "rc=$?"
job() { # job MODEL SYNC EXTRA: a 2-shard, 2-worker spec in /tmp/MODEL.json
  cat >/tmp/$1.json <<J
{"cluster": {"ps": ["127.0.0.1:7100", "127.0.0.1:7101"], "worker": ["127.0.0.1:7200", "127.0.0.1:7201"]},
 "job": {"name": "gpu-$1", "model": "$1", $3,
  "data_dir": "/usr/share/datasets/fashion-mnist", "epochs": 1, "batch_size": 64,
  "optimizer": {"type": "momentum", "lr": 0.02, "momentum": 0.9},
  "sync": $2, "seed": 1, "log_every": 400}}
J
}
job mlp '{"mode": "async"}' '"hidden": [256, 128]'
job cnn '{"mode": "sync", "deterministic": true}' '"channels": [16, 32]'
for m in mlp cnn; do
  for dev in cpu cuda; do
    echo "== standalone $m $dev"
    timeout 120 "$D/bin/dworker" --cluster /tmp/$m.json --standalone --device $dev 2>&1 | grep final
  done
done
for dev in cuda cuda; do
  echo "== job cnn workers --device $dev"
  timeout 120 "$D/bin/pslaunch" --psd "$D/bin/psd" --dworker "$D/bin/dworker" /tmp/cnn.json -- --device $dev 2>&1 | grep -E 'final:|job:|error' | tail -3
  echo "rc=${PIPESTATUS[0]}"
done
