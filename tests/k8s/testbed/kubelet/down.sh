#!/bin/bash
# Stops what kubelet/up.sh started, leaving no container, mount, iptables chain or bridge:
# workloads deleted through the API first, so the kubelet itself stops the pods (their CNI
# teardown and volume unmounts), then the node's processes by the PIDs up.sh recorded.
W=${K8S_TESTBED:-/var/cache/k8s-testbed}; R="$W/run"; N="$R/node"; B="$W/bin"
KUBECONFIG=${KUBECONFIG:-$R/kubeconfig}; export KUBECONFIG
BRIDGE=${K8S_BRIDGE:-tb-cni0}; CGROUP_ROOT=/k8s-testbed
[ -d "$N" ] || exit 0
CTR=(ctr --address "$N/containerd.sock" -n k8s.io)
running() { "${CTR[@]}" tasks ls -q 2>/dev/null | grep -c . ; }
stop() {  # by recorded PID: TERM, then KILL after 10 s
  local p; p=$(cat "$N/$1.pid" 2>/dev/null) || return 0
  kill "$p" 2>/dev/null || return 0
  for i in $(seq 1 100); do kill -0 "$p" 2>/dev/null || return 0; sleep 0.1; done
  kill -9 "$p" 2>/dev/null; true
}
if kill -0 "$(cat "$N/kubelet.pid" 2>/dev/null)" 2>/dev/null; then
  kubectl delete statefulsets,deployments,replicasets,daemonsets,jobs --all -A --wait=false >/dev/null 2>&1
  kubectl delete pods --all -A --grace-period=1 --wait=false >/dev/null 2>&1
  for i in $(seq 1 120); do [ "$(running)" = 0 ] && break; sleep 0.5; done
fi
stop scheduler; stop proxy; stop kubelet
# Whatever the kubelet did not stop in time.
for task in $("${CTR[@]}" tasks ls -q 2>/dev/null); do
  "${CTR[@]}" tasks kill -s SIGKILL "$task" >/dev/null 2>&1
  for i in $(seq 1 50); do "${CTR[@]}" tasks delete "$task" >/dev/null 2>&1 && break; sleep 0.1; done
done
stop containerd
# kube-proxy's KUBE-* chains (one node test bed per machine: they are all its own).
for t in filter nat mangle; do
  iptables-save -t "$t" | sed -n 's/^-A \(INPUT\|OUTPUT\|FORWARD\|PREROUTING\|POSTROUTING\) \(.*-j KUBE-.*\)$/-D \1 \2/p' \
    | while read -r rule; do eval iptables -t "$t" "$rule"; done
  chains=$(iptables-save -t "$t" | sed -n 's/^:\(KUBE-[^ ]*\) .*/\1/p')
  for c in $chains; do iptables -t "$t" -F "$c"; done
  for c in $chains; do iptables -t "$t" -X "$c"; done
done
# Mounts under the node's directory (secret tmpfs, overlay rootfs, netns), deepest first.
awk -v n="$N/" 'index($2, n) == 1 {print $2}' /proc/mounts | sort -r | xargs -r -n1 umount -l 2>/dev/null
ip link del "$BRIDGE" 2>/dev/null
for h in /sys/fs/cgroup/*/; do
  [ -d "$h${CGROUP_ROOT#/}" ] && find "$h${CGROUP_ROOT#/}" -depth -type d -exec rmdir {} + 2>/dev/null
done
true
