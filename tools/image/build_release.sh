#!/bin/bash
# Builds the broker/operator image of an earlier release (RELEASES: release, commit) from
# that commit's own Dockerfile and sources, tagged durable-mqtt-broker:RELEASE only (never
# :dev, which tools/image/build.sh keeps for this tree): what a rolling upgrade on Kubernetes
# starts from (tests/k8s_e2e/test_upgrade.py). Skipped when the image on hand was built from
# that commit (label org.durablemqtt.commit).
#   build_release.sh RELEASE   (NATIVE=0, IMAGE_BASE=... as for build.sh)
set -euo pipefail
cd "$(dirname "$0")/../.."
source tools/image/engine.sh
source tools/image/common.sh
release=${1:?usage: build_release.sh RELEASE}
commit=$(awk -v r="$release" '$1 == r {print $2}' RELEASES)
[ -n "$commit" ] || { echo "release $release is not listed in RELEASES" >&2; exit 1; }
commit=$(git rev-parse --verify "$commit^{commit}") \
  || { echo "release $release needs its commit in this clone (a full one)" >&2; exit 1; }
image=durable-mqtt-broker:$release
LABEL=org.durablemqtt.commit
if [ "$($ENGINE image inspect --format "{{ index .Config.Labels \"$LABEL\" }}" "$image" \
      2>/dev/null || true)" = "$commit" ]; then
  echo "$image is up to date ($commit)"; exit 0
fi
base_image=$(base)
tree=$(mktemp -d)
trap 'rm -rf "$tree"' EXIT
git clone -q --shared --no-checkout . "$tree"
git -C "$tree" checkout -q "$commit"
start=$SECONDS
log=$(mktemp)
if ! (cd "$tree" && DOCKER_BUILDKIT=1 $ENGINE build "${BUILD_FLAGS[@]}" \
      --build-arg "BASE=$base_image" --build-arg "NATIVE=${NATIVE:-1}" --label "$LABEL=$commit" \
      -f Dockerfile -t "$image" .) >"$log" 2>&1; then
  tail -40 "$log"; rm -f "$log"; echo "building $image failed" >&2; exit 1
fi
rm -f "$log"
echo "$image built from $commit in $((SECONDS - start)) s"
