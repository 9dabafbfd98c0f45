"""What the MQTTCluster says of a Secret or ConfigMap its spec names that is missing, or
lacks a key the pods mount (contract section 2c): named, with the field naming it."""

from mqtt_operator.references import missing
from mqtt_operator.spec import Cluster
from tests.support.crd import body

SPEC = {"auth": {"passwordSecret": {"name": "users"}},
        "acl": {"configMapName": "rules"},
        "tls": {"secretName": "certs", "verifyPeer": True}}


def test_each_missing_object_or_key_is_named_with_its_field() -> None:
    cluster = Cluster.from_body(body("web", **SPEC))
    objects = {("Secret", "users"): {"passwd"}, ("ConfigMap", "rules"): {"acl"},
               ("Secret", "certs"): {"tls.crt", "tls.key", "ca.crt"}}
    assert missing(cluster, lambda kind, name: objects.get((kind, name))) == []
    del objects[("ConfigMap", "rules")]
    objects[("Secret", "certs")] = {"tls.crt", "tls.key"}  # no ca.crt, which verifyPeer needs
    found = missing(cluster, lambda kind, name: objects.get((kind, name)))
    assert [reason for reason, _ in found] == ["ConfigMapMissing", "SecretMissing"]
    assert "ConfigMap rules (named by spec.acl) does not exist" in found[0][1]
    assert "Secret certs (named by spec.tls.secretName) has no key ca.crt" in found[1][1]


def test_the_generated_user_and_unset_fields_are_not_looked_for() -> None:
    asked: list[tuple[str, str]] = []
    missing(Cluster.from_body(body("web")), lambda kind, name: asked.append((kind, name)))
    assert asked == []  # the operator's own user Secret; no ACL, no TLS
    tls_only = Cluster.from_body(body("web", tls={"secretName": "certs"}))
    assert missing(tls_only, lambda kind, name: {"tls.crt", "tls.key"}) == []  # no verifyPeer
