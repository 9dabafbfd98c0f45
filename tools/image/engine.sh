#!/bin/bash
# Prints the container engine to use: docker where its daemon answers, else podman (installed
# from Debian when missing). Source it to get $ENGINE and, for podman, CONTAINERS_CONF.
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
if docker info >/dev/null 2>&1; then
  ENGINE=docker
else
  if ! command -v podman >/dev/null || ! command -v runc >/dev/null; then
    apt-get update -q >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends podman runc >/dev/null
  fi
  ENGINE=podman
  export CONTAINERS_CONF="$HERE/containers.conf"
fi
[ "${BASH_SOURCE[0]}" != "$0" ] || echo "$ENGINE"
