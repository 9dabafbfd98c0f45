#!/bin/bash
# Adds a node to a running test bed (../up.sh): containerd (runc, cgroupfs, CNI bridge),
# kubelet, kube-proxy (iptables) and kube-scheduler, so Pods get scheduled, run and reach
# Services. Everything lives in $K8S_TESTBED/run/node; down.sh stops it all. One node test
# bed per machine at a time: kube-proxy owns the host's KUBE-* iptables chains.
#   K8S_TESTBED, KUBECONFIG       the control plane's (up.sh writes run/kubeconfig)
#   K8S_KUBELET_PORT              the kubelet's API port on 127.0.0.1 (default 10250)
#   K8S_PROXY_PORT                kube-proxy's healthz port on 127.0.0.1 (its metrics: +1)
#   K8S_POD_CIDR                  the pods' network (default 10.244.0.0/24), on bridge
#   K8S_BRIDGE                    (default tb-cni0)
#   K8S_PVS                       hostPath PersistentVolumes to offer (default 24)
#   K8S_IMAGES                    image archives to import (space separated), e.g. from
#                                 `podman save`; their names are tagged for Kubernetes too
set -euo pipefail
W=${K8S_TESTBED:-/var/cache/k8s-testbed}; R="$W/run"; N="$R/node"; B="$W/bin"
KUBECONFIG=${KUBECONFIG:-$R/kubeconfig}; export KUBECONFIG
POD_CIDR=${K8S_POD_CIDR:-10.244.0.0/24}; BRIDGE=${K8S_BRIDGE:-tb-cni0}
SERVICE_CIDR=10.0.0.0/24  # ../up.sh's --service-cluster-ip-range
# The node's name is its address too: the API server reaches the kubelet (logs, exec) at
# localhost, where it listens; a loopback node IP is refused, so this is the one way there.
NODE=localhost; CGROUP_ROOT=/k8s-testbed
PAUSE=k8s-testbed.local/pause:3.6
if kill -0 "$(cat "$N/kubelet.pid" 2>/dev/null)" 2>/dev/null; then
  echo "a node already runs in $N (down.sh stops it)" >&2; exit 1
fi
mkdir -p "$N/cni" "$N/containerd" "$N/kubelet" "$N/pv"
SOCK="$N/containerd.sock"

cat >"$N/containerd.toml" <<T
version = 2
root = "$N/containerd/root"
state = "$N/containerd/state"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper"]
[grpc]
  address = "$SOCK"
[plugins."io.containerd.internal.v1.opt"]
  path = "$N/containerd/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE"
  # Lowering oom_score_adj (kubelet asks -998 for sandboxes) needs CAP_SYS_RESOURCE, which
  # sandboxed hosts withhold: never below containerd's own.
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$N/cni"
T
cat >"$N/cni/10-testbed.conflist" <<T
{"cniVersion": "0.4.0", "name": "testbed", "plugins": [
  {"type": "bridge", "bridge": "$BRIDGE", "isGateway": true, "ipMasq": true, "hairpinMode": true,
   "ipam": {"type": "host-local", "ranges": [[{"subnet": "$POD_CIDR"}]],
            "routes": [{"dst": "0.0.0.0/0"}], "dataDir": "$N/cni-ipam"}},
  {"type": "portmap", "capabilities": {"portMappings": true}},
  {"type": "loopback"}]}
T
# ClusterIPs stay on this machine even before kube-proxy has written its rules: a route into
# the pods' bridge, never out of the default route.
ip link show "$BRIDGE" >/dev/null 2>&1 || ip link add "$BRIDGE" type bridge
ip link set "$BRIDGE" up
ip route replace "$SERVICE_CIDR" dev "$BRIDGE"
# Pods reach the API server (on loopback only) at the kubernetes Service's ClusterIP: the
# API server publishes no Endpoints for a loopback address, so this rule stands in for them
# (a KUBE-* chain: down.sh removes it with kube-proxy's).
API_IP=$(kubectl get service kubernetes -n default -o jsonpath='{.spec.clusterIP}')
API_PORT=$(kubectl config view --minify -o jsonpath='{.clusters[0].cluster.server}' | sed 's/.*://')
iptables -t nat -N KUBE-TESTBED-API 2>/dev/null || iptables -t nat -F KUBE-TESTBED-API
iptables -t nat -A KUBE-TESTBED-API -i "$BRIDGE" -d "$API_IP" -p tcp --dport 443 \
  -j DNAT --to-destination "127.0.0.1:$API_PORT"
iptables -t nat -C PREROUTING -j KUBE-TESTBED-API 2>/dev/null || iptables -t nat -I PREROUTING -j KUBE-TESTBED-API
sysctl -qw "net.ipv4.conf.$BRIDGE.route_localnet=1"
# kubelet puts its pods' cgroups under this root, in every hierarchy (cgroup v1).
for h in /sys/fs/cgroup/*/; do [ -d "$h" ] && mkdir -p "$h${CGROUP_ROOT#/}" 2>/dev/null || true; done

containerd --config "$N/containerd.toml" >"$N/containerd.log" 2>&1 & echo $! >"$N/containerd.pid"
CTR=(ctr --address "$SOCK" -n k8s.io)
for i in $(seq 1 100); do "${CTR[@]}" version >/dev/null 2>&1 && break; sleep 0.1; done
"${CTR[@]}" version >/dev/null
for archive in "$W/images/pause.tar" ${K8S_IMAGES:-}; do
  "${CTR[@]}" images import "$archive" >/dev/null
done
# Kubernetes names an image without a registry docker.io/library/NAME; podman's archives
# call local images localhost/NAME.
for name in $("${CTR[@]}" images ls -q | grep '^localhost/'); do
  "${CTR[@]}" images tag --force "$name" "docker.io/library/${name#localhost/}" >/dev/null
done

"$B/kube-scheduler" --kubeconfig="$KUBECONFIG" --leader-elect=false --port=0 --secure-port=0 \
  >"$N/scheduler.log" 2>&1 & echo $! >"$N/scheduler.pid"
"$B/kubelet" --kubeconfig="$KUBECONFIG" --hostname-override="$NODE" \
  --container-runtime=remote --container-runtime-endpoint="unix://$SOCK" \
  --image-service-endpoint="unix://$SOCK" --runtime-request-timeout=5m \
  --cgroup-driver=cgroupfs --cgroup-root="$CGROUP_ROOT" --root-dir="$N/kubelet" \
  --cert-dir="$N/kubelet/pki" --address=127.0.0.1 --port="${K8S_KUBELET_PORT:-10250}" \
  --read-only-port=0 --healthz-port=0 --anonymous-auth=true --authorization-mode=AlwaysAllow \
  --fail-swap-on=false --eviction-hard='memory.available<100Mi' --image-gc-high-threshold=100 \
  --resolv-conf=/etc/resolv.conf --pod-infra-container-image="$PAUSE" \
  --volume-plugin-dir="$N/kubelet/plugins" --sync-frequency=10s --make-iptables-util-chains=false \
  >"$N/kubelet.log" 2>&1 & echo $! >"$N/kubelet.pid"
P=${K8S_PROXY_PORT:-10256}
"$B/kube-proxy" --kubeconfig="$KUBECONFIG" --hostname-override="$NODE" --proxy-mode=iptables \
  --cluster-cidr="$POD_CIDR" --masquerade-all --bind-address=127.0.0.1 \
  --healthz-bind-address="127.0.0.1:$P" --metrics-bind-address="127.0.0.1:$((P + 1))" \
  --conntrack-max-per-core=0 --conntrack-tcp-timeout-established=0 \
  --conntrack-tcp-timeout-close-wait=0 >"$N/proxy.log" 2>&1 & echo $! >"$N/proxy.pid"
for i in $(seq 1 240); do
  [ "$(kubectl get node "$NODE" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" = True ] && break
  sleep 0.25
done
kubectl get node "$NODE" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' | grep -q True \
  || { echo "node not Ready; kubelet log:"; tail -30 "$N/kubelet.log"; exit 1; }
# The taint a node registers with is lifted by the node lifecycle controller, which ../up.sh
# leaves out (it would evict pods of a node whose kubelet is stopped for a test).
kubectl taint node "$NODE" node.kubernetes.io/not-ready:NoSchedule- >/dev/null 2>&1 || true
# Volumes for the StatefulSets' claims (no provisioner here): hostPath PVs without a class,
# kept after their claim goes (Retain), writable by the pods' non-root users.
PVS=${K8S_PVS:-24}
for i in $(seq 1 "$PVS"); do
  mkdir -p "$N/pv/$i" && chmod 1777 "$N/pv/$i"
  printf '{"apiVersion":"v1","kind":"PersistentVolume","metadata":{"name":"testbed-pv-%s"},"spec":{"capacity":{"storage":"100Gi"},"accessModes":["ReadWriteOnce"],"persistentVolumeReclaimPolicy":"Retain","hostPath":{"path":"%s","type":"Directory"}}}\n' \
    "$i" "$N/pv/$i"
done | kubectl apply -f - >/dev/null
echo "node $NODE Ready"
