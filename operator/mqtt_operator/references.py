"""The Secrets and ConfigMaps a cluster's spec names for the brokers' files (contract section
2c), and what is missing of them. Pure: `keys_of` reads.

Kubelet keeps a pod whose volume's object or item is missing in ContainerCreating and says
so only in an Event on the pod; the MQTTCluster says it too (Degraded), naming the object,
the key and the field, so `kubectl get mqc` shows why the cluster does not come up. Only the
keys' names are read, never their values.
"""

from collections.abc import Callable

from mqtt_operator import constants as c
from mqtt_operator.spec import Cluster

# (kind, name) -> the object's keys (data and binaryData); None: no such object
KeysOf = Callable[[str, str], set[str] | None]


def named(cluster: Cluster) -> list[tuple[str, str, tuple[str, ...], str]]:
    """(kind, name, keys the pods mount, the spec field naming it). The generated user's
    Secret is the operator's own and made before the pods: not listed."""
    found = []
    if cluster.passwords is not None:
        found.append(("Secret", cluster.passwords.name, (cluster.passwords.key,),
                      "spec.auth.passwordSecret"))
    if cluster.acl is not None:
        found.append(("ConfigMap" if cluster.acl.kind == "configMap" else "Secret",
                      cluster.acl.name, (cluster.acl.key,), "spec.acl"))
    if cluster.tls_secret is not None:
        keys = (c.TLS_CERT, c.TLS_KEY, *((c.TLS_CA,) if cluster.verify_peer else ()))
        found.append(("Secret", cluster.tls_secret, keys, "spec.tls.secretName"))
    return found


def missing(cluster: Cluster, keys_of: KeysOf) -> list[tuple[str, str]]:
    """(condition reason, message) per named object that is absent or lacks a key; the
    reason is `SecretMissing` or `ConfigMapMissing`."""
    problems = []
    for kind, name, keys, field in named(cluster):
        present = keys_of(kind, name)
        if present is None:
            what = f"{kind} {name} (named by {field}) does not exist"
        elif lacking := [key for key in keys if key not in present]:
            what = f"{kind} {name} (named by {field}) has no key {', '.join(lacking)}"
        else:
            continue
        problems.append((f"{kind}Missing", f"{what}: new broker pods wait in"
                         " ContainerCreating until it does"))
    return problems
