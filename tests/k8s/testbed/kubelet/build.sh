#!/bin/bash
# The node half of the test bed: kubelet, kube-proxy and kube-scheduler from the same Debian
# kubernetes source as the control plane (../build.sh, ~8 min once), Debian's containerd,
# runc, CNI plugins, iptables and conntrack, and the pods' sandbox image (pause.c) as an
# image archive. Skips whatever is already there.
# Usage: K8S_TESTBED=/var/cache/k8s-testbed build.sh
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
W=${K8S_TESTBED:-/var/cache/k8s-testbed}
if ! command -v containerd >/dev/null || ! command -v runc >/dev/null || [ ! -x /usr/lib/cni/bridge ] \
   || ! command -v iptables >/dev/null || ! command -v conntrack >/dev/null || ! command -v gcc >/dev/null; then
  apt-get update -q >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends containerd runc \
    containernetworking-plugins iptables conntrack gcc libc6-dev >/dev/null
fi
K8S_COMPONENTS="kubelet kube-proxy kube-scheduler" bash "$HERE/../build.sh"
PAUSE="$W/images/pause.tar"
[ -f "$PAUSE" ] && exit 0
# A docker-archive (what `ctr images import` reads) of one layer holding /pause.
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
mkdir "$T/root" && gcc -Os -static -o "$T/root/pause" "$HERE/pause.c"
tar -C "$T/root" --owner=0 --group=0 -cf "$T/layer.tar" pause
layer=$(sha256sum "$T/layer.tar" | cut -d' ' -f1)
printf '{"architecture":"amd64","os":"linux","config":{"Entrypoint":["/pause"]},"rootfs":{"type":"layers","diff_ids":["sha256:%s"]}}' \
  "$layer" > "$T/config.json"
config=$(sha256sum "$T/config.json" | cut -d' ' -f1)
mkdir "$T/$layer" && mv "$T/layer.tar" "$T/$layer/layer.tar" && mv "$T/config.json" "$T/$config.json"
printf '[{"Config":"%s.json","RepoTags":["k8s-testbed.local/pause:3.6"],"Layers":["%s/layer.tar"]}]' \
  "$config" "$layer" > "$T/manifest.json"
mkdir -p "$W/images"
tar -C "$T" -cf "$PAUSE.tmp" manifest.json "$config.json" "$layer/layer.tar" && mv "$PAUSE.tmp" "$PAUSE"
echo "pause image: $PAUSE"
