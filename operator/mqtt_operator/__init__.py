"""The kopf operator for MQTTCluster resources, and the `kubectl mqtt` plugin.

Pure decisions (spec, broker config, site IDs, placement, manifests, status) live in modules
that import neither kopf nor the Kubernetes client, so they are tested without a cluster;
`handlers` is the only module kopf sees.
"""
