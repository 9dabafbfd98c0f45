#!/bin/bash
# Builds the broker/operator image and the Spark image (docker where its daemon answers,
# else podman), each only when its inputs changed since the image on hand was built: the
# files it is built from and the build arguments, hashed into the label
# org.durablemqtt.inputs. Tags :dev and the release (broker/version.py's RELEASE, which the
# chart's appVersion equals: what `helm install` pulls).
#   IMAGE_BASE=...  base image (default: python:3.11-slim when a registry answers, else a
#                   Debian bookworm base made here by tools/image/base.sh)
#   NATIVE=0        the hot path in pure Python (no mypyc build in the image)
set -euo pipefail
cd "$(dirname "$0")/../.."
source tools/image/engine.sh
source tools/image/common.sh
NATIVE=${NATIVE:-1}
VERSION=$(sed -n 's/^RELEASE: Final = "\(.*\)"$/\1/p' broker/version.py)  # = the chart's appVersion
LABEL=org.durablemqtt.inputs

# The hash of what an image is built from: tracked and new files (not ignored ones: no
# caches, no host native build) under the given paths, plus the words given after --.
inputs() {
  local paths=() words=()
  while [ $# -gt 0 ] && [ "$1" != -- ]; do paths+=("$1"); shift; done
  [ $# -gt 0 ] && shift && words=("$@")
  { git ls-files -co --exclude-standard -z -- "${paths[@]}" | sort -z | xargs -0 sha256sum
    printf '%s\n' "${words[@]}"; } | sha256sum | cut -c1-16
}

built_from() {
  $ENGINE image inspect --format "{{ index .Config.Labels \"$LABEL\" }}" "$1" 2>/dev/null || true
}

# build NAME HASH DOCKERFILE BUILD-ARGS...: skips when NAME:dev carries HASH.
build() {
  local name=$1 hash=$2 file=$3; shift 3
  if [ "$(built_from "$name:dev")" = "$hash" ]; then
    echo "$name:dev is up to date ($hash)"; return
  fi
  local start=$SECONDS log
  log=$(mktemp)
  if ! DOCKER_BUILDKIT=1 $ENGINE build "${BUILD_FLAGS[@]}" "$@" --label "$LABEL=$hash" \
      -f "$file" -t "$name:dev" -t "$name:$VERSION" . >"$log" 2>&1; then
    tail -40 "$log"; rm -f "$log"; echo "building $name failed" >&2; exit 1
  fi
  rm -f "$log"
  echo "$name:dev built in $((SECONDS - start)) s ($hash)"
}

BASE=$(base)
broker_hash=$(inputs Dockerfile .dockerignore pyproject.toml requirements.lock README.md \
  tools/image/lock_subset.py tools/build_native.py broker operator -- "$BASE" "$NATIVE")
build durable-mqtt-broker "$broker_hash" Dockerfile --build-arg "BASE=$BASE" \
  --build-arg "NATIVE=$NATIVE"
spark_hash=$(inputs spark-apps -- "$broker_hash")
build durable-mqtt-spark "$spark_hash" spark-apps/Dockerfile \
  --build-arg "BROKER_IMAGE=durable-mqtt-broker:dev"
$ENGINE images --format '{{.Repository}}:{{.Tag}} {{.Size}}' | grep -E 'durable-mqtt-(broker|spark):dev'

