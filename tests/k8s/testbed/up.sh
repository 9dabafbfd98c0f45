#!/bin/bash
# Start etcd + kube-apiserver + kube-controller-manager on loopback and write $K8S_TESTBED/run/kubeconfig.
# There is no scheduler and no kubelet: Pods are created but stay Pending.
# CRDS=path/to/crds.yaml applies CRDs before the controller-manager starts, so its garbage
# collector sees them at once (otherwise it notices new CRDs only at its 30 s discovery resync).
set -euo pipefail
W=${K8S_TESTBED:-/var/cache/k8s-testbed}; R="$W/run"; B="$W/bin"
PORT=${K8S_PORT:-6443}; ETCD_PORT=${K8S_ETCD_PORT:-23790}
# Vendored from the shared test bed; changed: K8S_KCM_PORT (the controller-manager's own
# port), so parallel test beds on one machine do not collide, and K8S_EGRESS_CONFIG (an
# EgressSelectorConfiguration: how the API server reaches pods for its proxy subresource).
command -v etcd >/dev/null || { apt-get install -y -q etcd-server >/dev/null; }
command -v kubectl >/dev/null || { apt-get install -y -q kubernetes-client >/dev/null; }
rm -rf "$R"; mkdir -p "$R/pki"
openssl genrsa -out "$R/pki/sa.key" 2048 2>/dev/null
openssl rsa -in "$R/pki/sa.key" -pubout -out "$R/pki/sa.pub" 2>/dev/null
echo 'test-token,admin,admin,system:masters' > "$R/pki/tokens.csv"
etcd --name t --data-dir "$R/etcd" --listen-client-urls "http://127.0.0.1:$ETCD_PORT" \
  --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" --listen-peer-urls "http://127.0.0.1:$((ETCD_PORT+10))" \
  --initial-advertise-peer-urls "http://127.0.0.1:$((ETCD_PORT+10))" --initial-cluster "t=http://127.0.0.1:$((ETCD_PORT+10))" \
  >"$R/etcd.log" 2>&1 & echo $! >"$R/etcd.pid"
"$B/kube-apiserver" --etcd-servers="http://127.0.0.1:$ETCD_PORT" --bind-address=127.0.0.1 --secure-port="$PORT" \
  --cert-dir="$R/pki" --insecure-port=0 --token-auth-file="$R/pki/tokens.csv" --authorization-mode=RBAC \
  --service-account-key-file="$R/pki/sa.pub" --service-account-signing-key-file="$R/pki/sa.key" \
  --service-account-issuer=https://kubernetes.default.svc --service-cluster-ip-range=10.0.0.0/24 \
  --advertise-address=127.0.0.1 --allow-privileged=true \
  ${K8S_EGRESS_CONFIG:+--egress-selector-config-file="$K8S_EGRESS_CONFIG"} >"$R/apiserver.log" 2>&1 & echo $! >"$R/apiserver.pid"
cat >"$R/kubeconfig" <<K
apiVersion: v1
kind: Config
clusters: [{name: local, cluster: {server: "https://127.0.0.1:$PORT", insecure-skip-tls-verify: true}}]
users: [{name: admin, user: {token: test-token}}]
contexts: [{name: local, context: {cluster: local, user: admin, namespace: default}}]
current-context: local
K
export KUBECONFIG="$R/kubeconfig"
for i in $(seq 1 240); do kubectl get --raw /readyz >/dev/null 2>&1 && break; sleep 0.25; done
kubectl get --raw /readyz >/dev/null
if [ -n "${CRDS:-}" ]; then
  kubectl apply -f "$CRDS" >/dev/null
  kubectl wait --for condition=established crd --all --timeout=30s >/dev/null
fi
"$B/kube-controller-manager" --kubeconfig="$R/kubeconfig" --leader-elect=false --bind-address=127.0.0.1 \
  --port=0 --secure-port="${K8S_KCM_PORT:-10257}" --controllers='*,-nodeipam,-nodelifecycle,-cloud-node-lifecycle,-service,-route' \
  --service-account-private-key-file="$R/pki/sa.key" --root-ca-file="$R/pki/apiserver.crt" \
  >"$R/kcm.log" 2>&1 & echo $! >"$R/kcm.pid"
for i in $(seq 1 120); do kubectl get sa default >/dev/null 2>&1 && break; sleep 0.25; done
echo "control plane up: KUBECONFIG=$R/kubeconfig"
