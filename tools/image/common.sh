#!/bin/bash
# What tools/image/build.sh and build_release.sh share; sourced after engine.sh.
#   base           the base image (IMAGE_BASE, else python:3.11-slim when a registry answers,
#                  else a Debian bookworm base made here by tools/image/base.sh)
#   BUILD_FLAGS    the engine's build flags: the host's network, the CA bundle as a build
#                  secret (never stored in a layer), docker's image format under podman
REGISTRY_BASE=docker.io/library/python:3.11-slim
LOCAL_BASE=localhost/durable-mqtt-base:bookworm

base() {
  if [ -n "${IMAGE_BASE:-}" ]; then echo "$IMAGE_BASE"; return; fi
  if $ENGINE image inspect "$REGISTRY_BASE" >/dev/null 2>&1 \
     || $ENGINE pull -q "$REGISTRY_BASE" >/dev/null 2>&1; then echo "$REGISTRY_BASE"; return; fi
  bash tools/image/base.sh "$LOCAL_BASE" >&2
  echo "$LOCAL_BASE"
}

BUILD_FLAGS=(--network host --secret "id=ca,src=/etc/ssl/certs/ca-certificates.crt")
[ "$ENGINE" = podman ] && BUILD_FLAGS+=(--format docker)
