#!/bin/sh
# set-shards.sh M [DIR]: sets the job's number of shards to M in the
# manifests of DIR (default: deploy/k8s, above this script), in place:
# shards.yaml's completions, parallelism and PSD_K8S_SHARDS, workers.yaml's
# and reshard/reshard-job.yaml's PSD_K8S_SHARDS. It also puts the shards'
# checkpoints on the claim psd-checkpoints (checkpoints.yaml) instead of
# the pod's emptyDir, which a reshard needs: run it once with the current
# count before the job first starts. Then, to change the count, see
# docs/reshard-deploy.md. Prints the lines it changed.
set -eu

usage() {
  echo "usage: set-shards.sh M [DIR]   (M: 1..4096 shards)" >&2
  exit 2
}
if [ $# -lt 1 ] || [ $# -gt 2 ]; then usage; fi
m=$1
case $m in '' | *[!0-9]* | 0*) usage ;; esac
[ "$m" -le 4096 ] || usage
dir=${2:-$(dirname "$0")/..}
for f in shards.yaml workers.yaml reshard/reshard-job.yaml; do
  [ -f "$dir/$f" ] || { echo "set-shards.sh: $dir/$f: no such file" >&2; exit 1; }
done

count='s/\({name: PSD_K8S_SHARDS, value: "\)[0-9]*"/\1'$m'"/'
sed -i -e "$count" \
  -e 's/^\(  completions: \)[0-9]*$/\1'"$m"'/' \
  -e 's/^\(  parallelism: \)[0-9]*$/\1'"$m"'/' \
  -e 's/^\(          \)emptyDir: {}$/\1persistentVolumeClaim: {claimName: psd-checkpoints}/' \
  "$dir/shards.yaml"
sed -i -e "$count" "$dir/workers.yaml" "$dir/reshard/reshard-job.yaml"
grep -n -e '{name: PSD_K8S_SHARDS' -e '^  completions:' -e '^  parallelism:' \
  -e 'claimName: psd-checkpoints' \
  "$dir/shards.yaml" "$dir/workers.yaml" "$dir/reshard/reshard-job.yaml"
