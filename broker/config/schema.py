"""Every configuration key the broker accepts: name, default, parser and documentation.

This list is the single source of truth: the loader validates against it, `broker config
docs` renders the README's reference table from it, and a test checks the README is current.
Names follow EMQX where EMQX has the setting, so EMQX users can carry their knowledge over.
"""

import json
from collections.abc import Callable
from typing import Any, NamedTuple

from broker.config.values import _string_items as string_items
from broker.config.values import (
    parse_address_list,
    parse_bind,
    parse_bool,
    parse_choice,
    parse_duration,
    parse_float,
    parse_int,
    parse_int_list,
    parse_node_list,
    parse_rate,
    parse_size,
    parse_str,
)


class Setting(NamedTuple):
    key: str
    default: Any
    parse: Callable[[Any], Any]
    doc: str


def _listener_limits(listener: str, label: str) -> tuple[Setting, ...]:
    """A listener's connection limits and per-client rate limits (EMQX's keys and values)."""
    prefix = f"listeners.{listener}.default."
    return (
        Setting(prefix + "max_connections", 0, parse_int(0, 2**31),
                f"Connections the {label} listener keeps open at once; one more is closed as"
                " soon as it is accepted, before anything is read. 0 = no limit."),
        Setting(prefix + "max_conn_rate", 0, parse_int(0, 2**31),
                f"New connections per second the {label} listener accepts (bursts up to one"
                " second's worth); the others are closed at once. 0 = no limit."),
        Setting(prefix + "messages_rate", "infinity", parse_rate(sizes=False),
                f"PUBLISH packets one client of the {label} listener may send, as"
                " `COUNT/PERIOD` (`1000/s`, `10/100ms`); a client above it is not read until it"
                " is back under (bursts up to one period's worth), nothing is dropped or"
                " refused. `infinity` = no limit."),
        Setting(prefix + "bytes_rate", "infinity", parse_rate(sizes=True),
                f"Bytes one client of the {label} listener may send, as `SIZE/PERIOD`"
                " (`1MB/s`, `64KB/s`), throttled the same way. `infinity` = no limit."),
    )


def _auth_order(raw: Any) -> tuple[str, ...]:
    """`authentication.order`: each of file, jwt, http at most once."""
    items = tuple(item.lower() for item in string_items(raw))
    if not items or len(set(items)) != len(items) or set(items) - {"file", "jwt", "http"}:
        raise ValueError(f"expected a list of file, jwt, http, each once, got {raw!r}")
    return items


def _json_object(raw: Any) -> dict[str, Any]:
    """A JSON object written as text (`--set` or TOML), e.g. `{"content-type": "..."}`."""
    value = json.loads(raw) if isinstance(raw, str) else raw
    if not isinstance(value, dict):
        raise ValueError(f"expected a JSON object, got {raw!r}")
    return value


def _string_map(raw: Any) -> dict[str, str]:
    value = _json_object(raw)
    if not all(isinstance(item, str) for item in value.values()):
        raise ValueError(f"expected a JSON object of strings, got {raw!r}")
    return value


SETTINGS: tuple[Setting, ...] = (
    Setting("node.name", "broker@127.0.0.1", parse_str, "Node name, shown in the API."),
    Setting("node.data_dir", "data", parse_str,
            "Directory for everything stored on disk (retained messages, Durable Storage)."),
    Setting("node.site_id", "", parse_str,
            "This node's Durable Storage site ID. Empty = random at first start, then kept in"
            " the data dir; a value that contradicts the data dir's is refused at start-up."),
    Setting("node.cookie", "", parse_str,
            "Shared secret of the cluster's nodes: an inter-node connection proves it knows"
            " the cookie by an HMAC challenge, never sending it. Empty = a random one made at"
            " first start and kept in the data dir (a node that can cluster with nobody until"
            " every node is given the same value)."),
    Setting("node.cookie_file", "", parse_str,
            "File holding the cookie, read at start-up when `node.cookie` is empty (e.g. a"
            " mounted Kubernetes Secret): the secret is then in neither the config file nor"
            " the command line. A missing or empty file stops start-up. Empty = unused."),
    Setting("node.dist_net_ticktime", "10s", parse_duration,
            "A peer silent for this long (no frame, no heartbeat: frozen, partitioned) is"
            " declared down, its link closed and its routes purged; heartbeats go out every"
            " quarter of it."),
    Setting("node.graceful_stop_timeout", "5s", parse_duration,
            "On SIGTERM, how long a node in a cluster waits for the Raft groups it leads"
            " (metadata, sessions, Durable Storage shards) to be led by other nodes before"
            " it disconnects its clients (MQTT 5: DISCONNECT 0x8B) and exits: the groups need"
            " not wait an election timeout to replace their leader. 0 = no hand-over."),
    Setting("node.event_loop", "asyncio", parse_choice("asyncio", "uvloop"),
            "The event loop: `asyncio` (the standard library's) or `uvloop` (libuv's: ~5% less"
            " CPU per QoS 1 message in `bench/run.py` b and d, the same memory), for a node"
            " alone or in a cluster."),
    Setting("cluster.name", "mqttcl", parse_str,
            "Cluster name: nodes with different names never join, whatever their cookies."),
    Setting("cluster.discovery_strategy", "manual",
            parse_choice("manual", "static", "dns", "k8s"),
            "How a node finds its peers: `manual` (`broker ctl cluster join`, and the members"
            " remembered in the data dir), `static` (`cluster.static.seeds`), `dns`"
            " (`cluster.dns.*`, e.g. a Kubernetes headless Service) or `k8s` (the Endpoints"
            " of a Service, from the Kubernetes API: `cluster.k8s.*`)."),
    Setting("cluster.static.seeds", "[]", parse_node_list,
            "Nodes to join, as `NAME@HOST` or `NAME@HOST:PORT` (without a port:"
            " `rpc.tcp_server_port`). Listing every node, this one included, is fine."),
    Setting("cluster.dns.name", "", parse_str,
            "DNS name listing the cluster's nodes (with `discovery_strategy = dns`)."),
    Setting("cluster.dns.record_type", "a", parse_choice("a", "srv"),
            "`a`: the name's A/AAAA records are the nodes, each on `rpc.tcp_server_port`;"
            " `srv`: SRV records give host and port."),
    Setting("cluster.dns.nameservers", "[]", parse_address_list,
            "DNS servers (`HOST` or `HOST:PORT`) to ask instead of the system's resolver."),
    Setting("cluster.k8s.apiserver", "", parse_str,
            "Kubernetes API server for `discovery_strategy = k8s`. Empty = the one the pod"
            " runs under, from `KUBERNETES_SERVICE_HOST`/`_PORT` (EMQX's default,"
            " `https://kubernetes.default.svc:443`, needs cluster DNS). The pod's service"
            " account token and CA authenticate; it needs `get` on the Endpoints."),
    Setting("cluster.k8s.service_name", "", parse_str,
            "Service whose Endpoints are the cluster's nodes (a headless Service), each on"
            " its Endpoints port named `rpc`, else on `rpc.tcp_server_port`."),
    Setting("cluster.k8s.namespace", "default", parse_str,
            "Namespace of `cluster.k8s.service_name`."),
    Setting("cluster.k8s.address_type", "ip", parse_choice("ip", "dns", "hostname"),
            "How a peer is dialled: `ip` (the pod IP), `dns` (`<ip with dashes>.<namespace>."
            "<suffix>`) or `hostname` (`<hostname>.<service_name>.<namespace>.<suffix>`)."),
    Setting("cluster.k8s.suffix", "pod.local", parse_str,
            "Domain suffix of the names `address_type` `dns` and `hostname` build."),
    Setting("cluster.autoclean", "24h", parse_duration,
            "A member down this long is dropped from the member list (it rejoins by itself"
            " when it returns); 0 = never."),
    Setting("rpc.tcp_server_port", 5369, parse_int(0, 65535),
            "Port of the inter-node listener (one authenticated connection per peer carries"
            " routes, forwarded messages, Raft and RPC); 0 = any free port, advertised to"
            " peers as bound (for tests)."),
    Setting("rpc.listen_address", "0.0.0.0", parse_str,
            "Address the inter-node listener binds."),
    Setting("log.console.level", "info",
            parse_choice("debug", "info", "warning", "error", "critical"),
            "Log level on stderr."),
    Setting("listeners.tcp.default.bind", "0.0.0.0:1883", parse_bind,
            "MQTT over TCP. `off` disables it."),
    Setting("listeners.ws.default.bind", "0.0.0.0:8083", parse_bind,
            "MQTT over WebSocket. `off` disables it."),
    Setting("listeners.ws.default.websocket.mqtt_path", "/mqtt", parse_str,
            "HTTP path of the WebSocket listener (subprotocol `mqtt`)."),
    Setting("listeners.ws.default.websocket.supported_subprotocols", "mqtt, mqttv3.1", parse_str,
            "WebSocket subprotocols accepted (comma-separated); the first the client offers"
            " is answered."),
    Setting("listeners.ws.default.websocket.fail_if_no_subprotocol", True, parse_bool,
            "Refuse (HTTP 400) a WebSocket upgrade offering none of the supported"
            " subprotocols: MQTT over WebSocket requires one (MQTT 5.0 section 6)."),
    Setting("listeners.ws.default.websocket.handshake_timeout", "10s", parse_duration,
            "Time a WebSocket connection may take to complete its HTTP upgrade request;"
            " `mqtt.idle_timeout` then applies until CONNECT."),
    Setting("listeners.ssl.default.bind", "0.0.0.0:8883", parse_bind,
            "MQTT over TLS; only started when certfile and keyfile are set."),
    Setting("listeners.ssl.default.ssl_options.certfile", "", parse_str,
            "PEM certificate chain for the TLS listener."),
    Setting("listeners.ssl.default.ssl_options.keyfile", "", parse_str,
            "PEM private key for the TLS listener."),
    Setting("listeners.ssl.default.ssl_options.cacertfile", "", parse_str,
            "CA bundle that client certificates are verified against (`verify_peer`)."),
    Setting("listeners.ssl.default.ssl_options.verify", "verify_none",
            parse_choice("verify_none", "verify_peer"),
            "`verify_peer`: a client certificate, if sent, must chain to `cacertfile`."
            " Only TLS 1.2 and 1.3 are accepted either way."),
    Setting("listeners.ssl.default.ssl_options.fail_if_no_peer_cert", False, parse_bool,
            "With `verify_peer`: refuse the TLS handshake of a client without a certificate."),
    Setting("mqtt.peer_cert_as_username", "disabled", parse_choice("disabled", "cn", "dn"),
            "Use the verified client certificate's subject as the user name: `cn` its"
            " Common Name, `dn` the whole subject (RFC 4514, e.g. `CN=dev1,O=Acme`). Such a"
            " client is authenticated by its certificate (no password checked, as Mosquitto's"
            " `use_identity_as_username`) and the ACL file names it as a user."),
    *_listener_limits("tcp", "MQTT over TCP"),
    *_listener_limits("ws", "MQTT over WebSocket"),
    *_listener_limits("ssl", "MQTT over TLS"),
    Setting("dashboard.listeners.http.bind", "0.0.0.0:18083", parse_bind,
            "HTTP API (`/api/v5/...`) and Prometheus `/metrics`. `off` disables it."),
    Setting("dashboard.listeners.http.header_timeout", "10s", parse_duration,
            "Time an HTTP connection may take to send a request's headers: the first from"
            " connecting, a later one from the previous response (keep-alive); and the"
            " longest an import's upload may go without a byte. 0: no bound on the first or"
            " on an upload, no keep-alive."),
    Setting("dashboard.default_username", "admin", parse_str,
            "User name of the web dashboard at `/` (EMQX's key); an API key's name and secret"
            " log in too, with the key's role."),
    Setting("dashboard.default_password", "public", parse_str,
            "Password of `default_username`. The default `public` is accepted only while the"
            " HTTP listener binds loopback: on any other bind the dashboard refuses every"
            " login but an API key's until another password is set."),
    Setting("dashboard.default_password_file", "", parse_str,
            "File holding the password (e.g. a mounted Kubernetes Secret), read at start-up"
            " when set; it wins over `default_password`. A missing or empty file stops"
            " start-up."),
    Setting("dashboard.token_expired_time", "60m", parse_duration,
            "Lifetime of a dashboard login: its token is refused once this has passed since"
            " login (or after logout)."),
    Setting("dashboard.unsuccessful_login_max_attempts", 5, parse_int(1, 1_000_000),
            "Failed dashboard logins from one client address, within"
            " `unsuccessful_login_interval`, that lock the address out (EMQX's key; EMQX"
            " counts per user name)."),
    Setting("dashboard.unsuccessful_login_interval", "5m", parse_duration,
            "Window in which failed logins are counted towards the lock."),
    Setting("dashboard.unsuccessful_login_lock_duration", "10m", parse_duration,
            "How long a locked address is refused (429 with Retry-After), even with the"
            " right password."),
    Setting("api_key.bootstrap_file", "", parse_str,
            "EMQX's API key file: `KEY:SECRET` or `KEY:SECRET:ROLE` lines, role"
            " `administrator` (the default: anything) or `viewer` (GET only). Every"
            " `/api/v5/...` endpoint but `status` and `ready` needs a key, sent as HTTP Basic"
            " (or `X-Api-Key: KEY:SECRET`): else 401, a viewer's change 403. Re-read when it"
            " changes; a bad file stops start-up, or later keeps the keys in force. Empty = an"
            " administrator key made at first start in `<node.data_dir>/api_key`, except on a"
            " loopback-only bind, where the API stays open (with a warning)."),
    Setting("prometheus.enable_basic_auth", False, parse_bool,
            "`/metrics` and `/api/v5/prometheus/stats` need an API key too (any role);"
            " off = open to scrapers. No effect while the API is open (loopback, no keys)."),
    Setting("mqtt.session_expiry_interval", "2h", parse_duration,
            "Session expiry for MQTT 3.1.1 clients connecting with clean session = 0."),
    Setting("mqtt.max_session_expiry_interval", "0s", parse_duration,
            "Upper bound applied to a client's Session Expiry Interval; 0 = no bound."),
    Setting("mqtt.max_packet_size", "1MB", parse_size,
            "Largest packet accepted from a client (advertised in CONNACK)."),
    Setting("mqtt.max_mqueue_len", 1000, parse_int(0, 2**31),
            "Messages queued per in-memory session while offline or when the in-flight window"
            " is full; the oldest is dropped when full. 0 = unlimited."),
    Setting("mqtt.mqueue_store_qos0", True, parse_bool,
            "Queue QoS 0 messages for offline in-memory sessions too."),
    Setting("mqtt.max_inflight", 32, parse_int(1, 65535),
            "Unacknowledged QoS 1/2 deliveries per client (also bounded by its Receive"
            " Maximum); advertised as our Receive Maximum."),
    Setting("mqtt.max_awaiting_rel", 100, parse_int(0, 65535),
            "Incoming QoS 2 messages awaiting PUBREL per client; 0 = unlimited."),
    Setting("mqtt.max_topic_alias", 65535, parse_int(0, 65535),
            "Topic Alias Maximum advertised to MQTT 5 clients; 0 disables aliases."),
    Setting("mqtt.max_clientid_len", 65535, parse_int(23, 65535), "Longest client ID accepted."),
    Setting("mqtt.max_subscriptions", 0, parse_int(0, 2**31),
            "Most subscriptions one session may hold; a SUBSCRIBE past it gets Quota exceeded"
            " (0x97; 3.1.1: 0x80) for each filter that would add one. 0 = no limit."),
    Setting("mqtt.max_topic_levels", 128, parse_int(1, 65535),
            "Most levels in a topic name or filter."),
    Setting("mqtt.max_qos_allowed", 2, parse_int(0, 2), "Maximum QoS advertised and granted."),
    Setting("mqtt.retain_available", True, parse_bool, "Accept retained messages."),
    Setting("mqtt.wildcard_subscription", True, parse_bool, "Allow `+`/`#` in filters."),
    Setting("mqtt.shared_subscription", True, parse_bool, "Allow `$share/group/filter`."),
    Setting("mqtt.shared_subscription_strategy", "round_robin",
            parse_choice("round_robin", "random", "hash_clientid", "sticky", "local"),
            "Which member of a shared group of memory sessions gets a message, among its"
            " members on every node: `round_robin`, `random`, `hash_clientid` (by publisher),"
            " `sticky` (the last one while it stays), `local` (members on the publishing node"
            " first). A durable group (members with durable sessions) ignores it: its storage"
            " shards are spread evenly over its connected members, so every strategy behaves"
            " like `hash_clientid` with rebalancing as members come and go"
            " (docs/architecture.md, Durable shared subscriptions)."),
    Setting("mqtt.keepalive_multiplier", 1.5, parse_float(1.0),
            "A client is disconnected after keepalive x this without a packet."),
    Setting("mqtt.server_keepalive", "0s", parse_duration,
            "If > 0, overrides the client's keepalive and is sent as Server Keep Alive."),
    Setting("mqtt.idle_timeout", "15s", parse_duration,
            "Time a new TCP connection may take to send CONNECT."),
    Setting("mqtt.packet_arrival_timeout", "30s", parse_duration,
            "Time a packet may take to arrive once its first byte came; the connection is"
            " closed when exceeded (a sender stalled mid-packet would hold up to"
            " `mqtt.max_packet_size` of buffer). 0 = no bound."),
    Setting("mqtt.max_awaiting_storage", 1000, parse_int(1, 2**31),
            "Incoming QoS 1/2 PUBLISHes per connection whose acknowledgement waits for Durable"
            " Storage; at this many the connection is not read until half are written (flow"
            " control for every MQTT 3.1.1 client, and for v5 clients beyond Receive Maximum)."),
    Setting("mqtt.max_awaiting_storage_bytes", "16MB", parse_size,
            "The same bound in payload bytes: a connection's PUBLISHes held until stored."),
    Setting("force_shutdown.max_heap_size", "32MB", parse_size,
            "Unsent output one client may hold (a client that does not read what it is"
            " sent): when more is due and more than this is still unsent, the client is"
            " closed and the output discarded; a durable session keeps its messages in"
            " storage, a memory session its unacknowledged ones until it expires. Keep it"
            " above `mqtt.max_inflight` x the largest message. 0 = no bound (QoS 0 messages"
            " are still dropped past 8 MB unsent)."),
    Setting("durable_sessions.enable", True, parse_bool,
            "Sessions with a Session Expiry Interval > 0 are durable: state and messages on"
            " disk in Durable Storage, surviving restarts."),
    Setting("durable_sessions.batch_size", 100, parse_int(1, 100_000),
            "Messages a durable session reads from a stream per fetch."),
    Setting("durable_sessions.shared_subscription_ack_timeout", "30s", parse_duration,
            "A member of a durable shared group whose in-flight window is full and that"
            " acknowledged nothing for this long is passed over: its storage shards go to the"
            " group's other connected members until it acknowledges again (what it holds stays"
            " with it). 0 = never."),
    Setting("durable_sessions.message_retention_period", "1d", parse_duration,
            "How long stored messages are kept; older generations are dropped whole."),
    Setting("durable_sessions.session_gc_interval", "10m", parse_duration,
            "How often expired durable sessions are garbage collected (their expiry timers"
            " normally end them first; the sweep also applies `session_ttl`). With"
            " `builtin_raft` the `sessions` group's leader also ends the expired sessions of"
            " nodes that are down."),
    Setting("durable_sessions.heartbeat_interval", "5s", parse_duration,
            "How often the node records that it is alive: after a crash, sessions that were"
            " connected count as disconnected since the last record (for expiry and wills)."),
    Setting("durable_sessions.checkpoint_interval", "20ms", parse_duration,
            "`builtin_raft`: how long a durable session's writes that need no fsync"
            " (acknowledgements, QoS 1 batch records, read positions) may wait to reach the"
            " `sessions` group together, each send being a Raft commit on every replica. A"
            " node killed loses at most this much of them: its sessions resume on another node"
            " with those messages sent again (DUP), never with one lost. `builtin_local`"
            " writes them at once."),
    Setting("durable_sessions.tombstone_ttl", "1d", parse_duration,
            "`builtin_raft`: how long the replicas remember an ended session's epoch, to"
            " refuse the writes of a node that still held the session (frozen or cut off"
            " while it ended); the `sessions` group's leader forgets older ones at each"
            " `session_gc_interval`. A node frozen for longer than this could bring such a"
            " session back with its stale state."),
    Setting("streams.auto_create", False, parse_bool,
            "A durable session's `SUBSCRIBE $stream/<name>/<filter>` creates the stream"
            " `<name>` with that filter when there is none (EMQX's auto-create). Off: streams"
            " are created by `POST /api/v5/message_streams` only, and such a subscription to a"
            " missing stream gets 0x8F."),
    Setting("durable_sessions.max_session_expiry_interval", "0s", parse_duration,
            "Administrative cap on a durable session's expiry interval (TBMQ's"
            " `max-expiry-interval`), granted in CONNACK; 0 = no cap."),
    Setting("durable_sessions.session_ttl", "0s", parse_duration,
            "How long a disconnected durable session that never expires (expiry 0xFFFFFFFF)"
            " is kept (TBMQ's `ttl`); 0 = forever."),
    Setting("durable_storage.messages.backend", "builtin_local",
            parse_choice("builtin_local", "builtin_raft"),
            "`builtin_local`: each node stores on its own disk (fsync per batch). `builtin_raft`:"
            " the `messages` shards and the `sessions` database are Raft groups across the"
            " cluster's nodes (`replication_factor` voters, the other nodes learners), a durable"
            " PUBLISH is acknowledged once a majority has it in its log, and a durable session"
            " resumes on any node. Every node of a cluster must use the same backend."),
    Setting("durable_storage.messages.n_shards", 16, parse_int(1, 1024),
            "Shards of the `messages` database (by publisher client ID); fixed when the"
            " database is created."),
    Setting("durable_storage.messages.replication_factor", 3, parse_int(1, 15),
            "Replicas of each shard in a cluster (capped by the number of sites)."),
    Setting("durable_storage.messages.placement_file", "/etc/mqtt/placement/placement.json",
            parse_str,
            "`builtin_raft`: the operator's shard placement (watched; docs/operator-contract.md"
            " section 3). Each shard votes on the sites it names, sites it lists as leaving are"
            " removed from every group; without the file voters come from the member list."),
    Setting("durable_storage.messages.layout.wildcard_thresholds", "[100, 10]",
            parse_int_list(1),
            "LTS: distinct values a topic level may take at each depth before it becomes a"
            " wildcard in the stream's structure; the last value repeats for deeper levels."),
    Setting("durable_storage.messages.flush_interval", "10ms", parse_duration,
            "Longest time a cooked batch waits in the write buffer."),
    Setting("durable_storage.messages.max_items", 1000, parse_int(1, 1_000_000),
            "Write buffer size that triggers an immediate flush."),
    Setting("durable_storage.messages.idle_flush_interval", "1ms", parse_duration,
            "Flush early when nothing new arrived for this long."),
    Setting("durable_storage.messages.compression", "none", parse_choice("none", "snappy"),
            "LevelDB block compression of the `messages` slabs' tables written from now on"
            " (tables already written keep theirs). LevelDB rewrites a table at each"
            " compaction, and with many topics in a shard every table overlaps the next, so"
            " a table is rewritten many times while its generation is current: `snappy`"
            " compresses it again at each rewrite. With ~130-byte JSON payloads from 50 topics"
            " that took 3x the CPU per message, and a shard's writes 3x as long, to save 42%"
            " of the disk (bench/compaction_bench.py)."),
    Setting("durable_storage.messages.generation_interval", "1h", parse_duration,
            "A new generation (time partition) is started this often; the old one is sealed:"
            " compacted, read-only, with a manifest.json for offline readers."),
    Setting("durable_storage.messages.generation_max_size", "1GB", parse_size,
            "A shard's current generation is sealed early once its stored messages reach"
            " this size."),
    Setting("durable_storage.messages.storage_quota", 0, parse_size,
            "EMQX 6.1's soft quota on the `messages` database's files on this node (0: none)."
            " Checked every second: over it, sealed generations past"
            " `durable_sessions.message_retention_period` are dropped at once, and if it is"
            " still over, durable PUBLISHes are refused as on a full disk (alarm"
            " `db_storage_quota_exceeded`) until it is back under."),
    Setting("durable_storage.messages.max_open_slabs", 64, parse_int(1, 100_000),
            "Generations (LevelDB directories, one per shard x generation) kept open at once,"
            " all shards: past it the least recently read sealed one is closed, and reopened"
            " when read again. Each shard's current generation, its next one (made ahead) and"
            " any in use stay open. An open one holds 4 file descriptors."),
    Setting("durable_storage.n_sites", 1, parse_int(1, 1024),
            "Running sites (this one included) a node waits to see before the cluster's"
            " metadata Raft group is created: they are its first voters (at most 5). Set it"
            " to the number of nodes started together, or each may create a group of its"
            " own. The choice is kept in the data dir; nodes that come later are added as"
            " learners and promoted up to 5 voters."),
    Setting("durable_storage.raft.election_timeout", "1s", parse_duration,
            "A follower that hears no leader for this long (randomised up to twice it) starts"
            " an election; a leader that hears from no majority for this long steps down."),
    Setting("durable_storage.raft.heartbeat_interval", "100ms", parse_duration,
            "How often a Raft leader sends heartbeats; the Raft clock ticks at half of it."),
    Setting("durable_storage.raft.leader_balance_interval", "1m", parse_duration,
            "How often a node hands the Raft groups it leads beyond its share to voters"
            " leading at least two fewer (a leadership transfer: no election, nothing lost),"
            " so that after a rolling restart or a failover the groups' work spreads over the"
            " nodes again instead of staying on the one that leads them all. 0 = never."),
    Setting("durable_storage.raft.wal_dir", "", parse_str,
            "Directory of the node's Raft write-ahead log (one for all its groups, fsync'd"
            " once per batch). Empty = `<node.data_dir>/raft/wal`."),
    Setting("durable_storage.raft.wal_max_size_bytes", "64MB", parse_size,
            "Size at which the write-ahead log starts a new segment; a segment is deleted"
            " once every group compacted past its entries. A group's log (kept in memory"
            " too) is also truncated once this many command bytes were applied since the"
            " last truncation."),
    Setting("durable_storage.raft.snapshot_interval", 4096, parse_int(1, 2**31),
            "Entries applied between two truncations of a group's log: the applied data"
            " (written to LevelDB without sync, the log being the durable copy) is flushed"
            " with one synced write, then the log is compacted up to it. A peer that fell"
            " behind the log's start gets a snapshot instead."),
    Setting("durable_storage.raft.snapshot_bytes_rate", "256MB/s",
            # A chunk paced slower than 64 KiB per 0.25 s (broker/raft/spool.py) could hold
            # the next one back past the election timeout, which gives the transfer up.
            parse_rate(sizes=True, zero_unlimited=True, lowest="256KB/s"),
            "Most bytes per second a node sends of Raft snapshots, all groups together"
            " (a replica catching up: a shard's sealed generations go as their LevelDB"
            " files, checksummed, and a broken transfer resumes where it stopped), so that a"
            " catch-up never takes the cluster links from client traffic; at least `256KB/s`"
            " (below it, chunks would wait so long that a transfer gives up). `infinity` or"
            " `0` = no limit."),
    Setting("durable_storage.raft.commit_timeout", "30s", parse_duration,
            "How long a retained PUBLISH waits for its Raft commit. The message reaches"
            " current subscribers at once; its PUBACK/PUBREC waits for the commit (on a"
            " minority's side: until a majority is back). Past this the client's connection"
            " is closed unacknowledged, so it resends, maybe to another node."),
    Setting("retainer.enable", True, parse_bool, "Store retained messages."),
    Setting("retainer.max_retained_messages", 0, parse_int(0, 2**31),
            "Most retained topics stored; when full, existing topics can be replaced but new"
            " ones are not stored. 0 = unlimited."),
    Setting("retainer.max_payload_size", "1MB", parse_size,
            "Retained messages with a larger payload are forwarded but not stored."),
    Setting("retainer.expiry_interval", "0s", parse_duration,
            "Lifetime of retained messages without their own Message Expiry Interval;"
            " 0 = never expire."),
    Setting("retainer.msg_clear_interval", "60s", parse_duration,
            "How often expired retained messages are deleted from disk (they are never"
            " delivered once expired regardless); 0 = only on read."),
    Setting("sys_topics.sys_msg_interval", "1m", parse_duration,
            "How often the node publishes its `$SYS/brokers/<node>/...` topics (EMQX's"
            " layout: `version`, `sysdescr` and `$SYS/brokers` retained; `uptime` in"
            " milliseconds, `datetime`, `stats/...` and `metrics/...` counts); 0 = never."),
    Setting("sys_topics.allow_client_publish", False, parse_bool,
            "Let clients publish to `$SYS` topics, which MQTT reserves for the server"
            " (section 4.7.2). Off: a v5 QoS 1/2 PUBLISH is answered Not authorized (0x87),"
            " any other is dropped, and both count as dropped (`sys_topic_denied`)."),
    Setting("authentication.password_file", "", parse_str,
            "Mosquitto's password file (`mosquitto_passwd`, `broker ctl users`): `$7$`"
            " PBKDF2-SHA512 and `$6$` SHA-512 entries. Re-read on SIGHUP and when it changes;"
            " a file that fails to parse stops start-up, or on reload keeps the previous one."
            " Empty = user names and passwords are not checked."),
    Setting("authentication.allow_anonymous", "auto", parse_choice("auto", "true", "false"),
            "Whether a CONNECT without a user name is accepted. `auto` = yes without a"
            " password file, JWT or HTTP authentication, no with one. Refused: v5 0x87,"
            " 3.1.1 return code 5."),
    Setting("authentication.order", "file,jwt,http", _auth_order,
            "The chain a CONNECT's user name and password go through, as EMQX's: each"
            " configured source (`file` = the password file) allows, denies, or passes to"
            " the next (a user the file does not know, a password that is not a JWT, HTTP"
            " `ignore` or no answer). When all pass: 0x86 (0x88 Server unavailable if the"
            " HTTP service did not answer), or anonymous without credentials."),
    Setting("authentication.scram.user_file", "", parse_str,
            "The SCRAM users (JSON: per user a salt, StoredKey and ServerKey for SHA-256 and"
            " SHA-512, as EMQX stores them; `broker ctl users add --scram`, or"
            " `/api/v5/authentication/scram:built_in_database/users`), re-read when it"
            " changes. Set: a CONNECT with Authentication Method `SCRAM-SHA-256` or"
            " `SCRAM-SHA-512` authenticates by MQTT 5 enhanced authentication (AUTH packets),"
            " re-authentication (AUTH 0x19) included; a missing file is an empty one."
            " Empty = enhanced authentication off (an Authentication Method gets 0x8C)."),
    Setting("authentication.scram.iteration_count", 4096, parse_int(4096, 1_000_000),
            "PBKDF2 iterations of a SCRAM credential made from now on (EMQX's"
            " `iteration_count`); each user keeps the count it was made with."),
    Setting("authentication.jwt.secret", "", parse_str,
            "JWT authentication with HS256, HS384 or HS512 and this secret (EMQX's"
            " `hmac-based`). Set at most one of `secret`, `public_key`, `jwks_file`,"
            " `endpoint`; none = JWT off."),
    Setting("authentication.jwt.secret_base64_encoded", False, parse_bool,
            "The secret is written in base64."),
    Setting("authentication.jwt.public_key", "", parse_str,
            "JWT with RS256/384/512 or ES256/384/512: the PEM public key, or a file holding"
            " it (read at start-up)."),
    Setting("authentication.jwt.jwks_file", "", parse_str,
            "JWT with RS*/ES*: a JWKS file (RFC 7517; keys chosen by the token's `kid`),"
            " re-read when it changes; a version that fails keeps the keys in force."),
    Setting("authentication.jwt.endpoint", "", parse_str,
            "JWT with RS*/ES*: a JWKS URL (EMQX's `use_jwks` with `endpoint`), fetched at"
            " start-up and every `refresh_interval` in the background; a fetch that fails"
            " keeps the keys in force (`mqtt_security_reloads_total{result=\"failed\"}`)."),
    Setting("authentication.jwt.refresh_interval", "5m", parse_duration,
            "How often the JWKS at `endpoint` is fetched again; 0 = once, at start-up."),
    Setting("authentication.jwt.from", "password", parse_choice("password", "username"),
            "The CONNECT field that carries the token."),
    Setting("authentication.jwt.leeway", "10s", parse_duration,
            "Clock skew allowed when checking `exp` and `nbf`."),
    Setting("authentication.jwt.verify_claims", "{}", _string_map,
            "Claims the token must carry, as a JSON object of claim -> value, where"
            " `${clientid}` and `${username}` stand for the CONNECT's (e.g."
            " `{\"sub\": \"${username}\"}`)."),
    Setting("authentication.jwt.acl_claim_name", "acl", parse_str,
            "The claim holding the client's ACL, in EMQX's formats (a list of"
            " `{permission, action, topic}`, or `{pub, sub, all}` lists), asked before"
            " `authorization.acl_file`."),
    Setting("authentication.jwt.disconnect_after_expire", True, parse_bool,
            "End a connection when its token's `exp` passes (v5: DISCONNECT 0xA0 Maximum"
            " connect time)."),
    Setting("authentication.http.url", "", parse_str,
            "EMQX's HTTP authentication: a CONNECT asks this URL. The answer: 200 with"
            " `{\"result\": \"allow\"|\"deny\"|\"ignore\", \"is_superuser\": ...,"
            " \"acl\": [...]}` or 204 (allow); anything else, or no answer in time, is"
            " `ignore`. Empty = off."),
    Setting("authentication.http.method", "post", parse_choice("post", "get"),
            "`post` sends the body as JSON; `get` sends its fields as the query string."),
    Setting("authentication.http.headers", '{"content-type": "application/json"}',
            _string_map, "Request headers, as a JSON object."),
    Setting("authentication.http.body", '{"username": "${username}", "password":'
            ' "${password}"}', _json_object,
            "The request's fields, a JSON object whose strings may hold `${clientid}`,"
            " `${username}`, `${password}`, `${peerhost}` (replaced inside the values, so"
            " quotes in a user name cannot change the document)."),
    Setting("authentication.http.request_timeout", "5s", parse_duration,
            "A request not answered in this time is `ignore`, counted as unavailable."),
    Setting("authentication.http.pool_size", 8, parse_int(1, 1024),
            "Connections to the service kept open and used at once."),
    Setting("authentication.http.max_inflight", 256, parse_int(1, 100_000),
            "Requests out at once (queued for a connection included); a CONNECT past it is"
            " not queued but passed on as if the service had not answered, so a slow or dead"
            " service never holds more than this many CONNECTs."),
    Setting("authorization.acl_file", "", parse_str,
            "Mosquitto's ACL file (`user NAME`, `topic [ACCESS] FILTER` with ACCESS one of"
            " `read`, `write`, `readwrite`, `deny`,"
            " `pattern ...` with `%c` and `%u`), re-read like the password file. Checked on"
            " SUBSCRIBE, PUBLISH, wills and every delivery. Empty = everything allowed."),
    Setting("authorization.deny_action", "ignore", parse_choice("ignore", "disconnect"),
            "What a denied PUBLISH or SUBSCRIBE gets: `ignore` = a refusal reason (v5 0x87,"
            " SUBACK 0x80 in 3.1.1) or, where the protocol has none, the message dropped;"
            " `disconnect` = the connection is closed (v5: DISCONNECT 0x87)."),
    Setting("authorization.no_match", "allow", parse_choice("allow", "deny"),
            "What a PUBLISH or SUBSCRIBE gets when no source decides: no ACL file and no"
            " rule that came with the credentials matching, or (with `authorization.http`)"
            " the service answering `ignore` and the file having no rule for the topic."),
    Setting("authorization.http.url", "", parse_str,
            "EMQX's HTTP authorization: a PUBLISH, SUBSCRIBE or will not decided by the"
            " rules that came with the credentials asks this URL, before the ACL file. The"
            " answer: 200 with `{\"result\": \"allow\"|\"deny\"|\"ignore\"}` or 204 (allow);"
            " `ignore` passes to the ACL file (where then a topic without a rule passes to"
            " `no_match`, EMQX's file source). Anything else, no answer in time, or"
            " `max_inflight` requests already out refuses the action without asking further:"
            " PUBACK/PUBREC/SUBACK 0x80 Unspecified error (service failed or timed out) or 0x97"
            " Quota exceeded (too many out), a will's CONNECT 0x88, 3.1.1 a SUBACK failure or"
            " the message dropped; counted in `mqtt_authz_unavailable_total`. Deliveries are"
            " checked against the credentials' rules and the file only. Empty = off."),
    Setting("authorization.http.method", "post", parse_choice("post", "get"),
            "`post` sends the body as JSON; `get` sends its fields as the query string."),
    Setting("authorization.http.headers", '{"content-type": "application/json"}',
            _string_map, "Request headers, as a JSON object."),
    Setting("authorization.http.body", '{"clientid": "${clientid}", "username":'
            ' "${username}", "topic": "${topic}", "action": "${action}", "qos": "${qos}",'
            ' "retain": "${retain}"}', _json_object,
            "The request's fields, a JSON object whose strings may hold `${clientid}`,"
            " `${username}`, `${peerhost}`, `${topic}` (a SUBSCRIBE's filter, without"
            " `$share/GROUP/`), `${action}` (`publish` or `subscribe`), `${qos}` and"
            " `${retain}` (`true`/`false`; `false` for a SUBSCRIBE)."),
    Setting("authorization.http.request_timeout", "5s", parse_duration,
            "A request not answered in this time refuses the action (0x80)."),
    Setting("authorization.http.pool_size", 8, parse_int(1, 1024),
            "Connections to the service kept open and used at once (a pool of its own, apart"
            " from authentication's, so a slow one cannot hold up the other)."),
    Setting("authorization.http.max_inflight", 256, parse_int(1, 100_000),
            "Requests out at once (queued for a connection included); an action past it is"
            " refused at once (0x97), so a slow or dead service holds at most this many"
            " actions; the client whose action waits is not read meanwhile, others are."),
    Setting("authorization.cache.enable", True, parse_bool,
            "Keep each connection's decisions (EMQX's authorization cache)."),
    Setting("authorization.cache.max_size", 32, parse_int(1, 1_000_000),
            "Decisions kept per connection and table (deliveries, publishes, and with"
            " `authorization.http` its actions by action, topic, QoS and retain); when full,"
            " the oldest is dropped. A changed ACL file empties every cache."),
    Setting("authorization.cache.ttl", "1m", parse_duration,
            "How long a decision made with `authorization.http` is kept (the service is not"
            " asked again about that action meanwhile); the file's decisions last until it"
            " changes. Refusals for an unavailable service are never kept."),
)

BY_KEY: dict[str, Setting] = {setting.key: setting for setting in SETTINGS}


def render_markdown_table() -> str:
    """The README's configuration reference, generated so it cannot drift from the code."""
    lines = ["| key | default | meaning |", "|---|---|---|"]
    for setting in SETTINGS:
        default = setting.default if setting.default != "" else "(empty)"
        if isinstance(default, bool):
            default = str(default).lower()
        lines.append(f"| `{setting.key}` | `{default}` | {setting.doc} |")
    return "\n".join(lines)
