"""Names shared by the operator, the kubectl plugin, the CRD and the broker contract.

One module so a rename cannot leave the CRD, the handlers and the plugin disagreeing; the
numbers here are the contract's (docs/operator-contract.md), not tunables.
"""

GROUP = "mqtt.durablemqtt.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "MQTTCluster"
PLURAL = "mqttclusters"
CRD_NAME = f"{PLURAL}.{GROUP}"

CONTRACT_VERSION = "v10"
DB = "messages"
FIELD_MANAGER = "mqtt-operator"

# Labels every child carries; the selector labels never change for the life of a cluster.
LABEL_NAME = "app.kubernetes.io/name"
LABEL_INSTANCE = "app.kubernetes.io/instance"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
APP_NAME = "mqtt-broker"

# Where the pod finds what the operator publishes (mount points of the three ConfigMaps and
# of the cookie and API key Secrets).
CONFIG_DIR = "/etc/mqtt/config"
SITES_DIR = "/etc/mqtt/sites"
PLACEMENT_DIR = "/etc/mqtt/placement"
COOKIE_DIR = "/etc/mqtt/cookie"
API_KEY_DIR = "/etc/mqtt/api-key"
# The MQTT clients' security files: each Secret or ConfigMap key is projected under a fixed
# file name, so the config names the same path whatever key the user's object uses.
USERS_DIR = "/etc/mqtt/users"
ACL_DIR = "/etc/mqtt/acl"
TLS_DIR = "/etc/mqtt/tls"
PASSWORD_FILE = "passwd"
ACL_FILE = "acl"
# A kubernetes.io/tls Secret's keys (cert-manager adds ca.crt), used as the file names too.
TLS_CERT, TLS_KEY, TLS_CA = "tls.crt", "tls.key", "ca.crt"
DATA_DIR = "/data"
BOOTSTRAP_VOTER_CAP = 5  # the broker's first voters at most (durable_storage.n_sites)
SITE_ID_FILE = "ds/site_id"  # under DATA_DIR: where a broker keeps its site (broker/ds/site.py)
CONFIG_FILE = "broker.toml"
PLACEMENT_FILE = "placement.json"
COOKIE_KEY = "cookie"
# The API key Secret: the brokers' bootstrap file, and its viewer key as a basic-auth pair
# (what the operator, `kubectl mqtt` and a ServiceMonitor ask the brokers with).
API_KEYS_FILE = "api_keys"
API_KEY_USERNAME = "username"
API_KEY_PASSWORD = "password"
ADMIN_KEY_NAME = "admin"
VIEWER_KEY_NAME = "viewer"
# The generated MQTT user's Secret: its password file (PASSWORD_FILE) and the pair in clear,
# for people and their clients.
USER_USERNAME = "username"
USER_PASSWORD = "password"

MQTT_PORT_NAME = "mqtt"
TLS_PORT_NAME = "mqtts"
WS_PORT_NAME = "ws"
HTTP_PORT_NAME = "http"
RPC_PORT_NAME = "rpc"  # inter-node; brokers dial the Endpoints port of this name

# The brokers' HTTP API as the contract uses it.
STATUS_PATH = "/status"
READY_PATH = "/api/v5/ready"
NODES_PATH = "/api/v5/nodes"


def config_map_name(cluster: str) -> str:
    return f"{cluster}-config"


def sites_map_name(cluster: str) -> str:
    return f"{cluster}-sites"


def placement_map_name(cluster: str) -> str:
    return f"{cluster}-placement"


def cookie_secret_name(cluster: str) -> str:
    return f"{cluster}-cookie"


def api_key_secret_name(cluster: str) -> str:
    return f"{cluster}-api-key"


def user_secret_name(cluster: str) -> str:
    """The generated MQTT user (when spec.auth names no password Secret)."""
    return f"{cluster}-mqtt-user"


def headless_service_name(cluster: str) -> str:
    return f"{cluster}-headless"


def broker_account_name(cluster: str) -> str:
    """The brokers' ServiceAccount (and its Role and RoleBinding): peer discovery reads the
    headless Service's Endpoints with it."""
    return f"{cluster}-broker"


# On a broker pod: the site the operator bound to the pod's claim (its volume). A pod on a
# volume that holds no site yet starts only with it (contract section 2).
SITE_ANNOTATION = f"{GROUP}/site-id"


def data_claim_name(cluster: str, ordinal: int) -> str:
    """The StatefulSet's claim of one pod (volumeClaimTemplate `data`)."""
    return f"data-{cluster}-{ordinal}"


def selector_labels(cluster: str) -> dict[str, str]:
    return {LABEL_NAME: APP_NAME, LABEL_INSTANCE: cluster}
