#!/usr/bin/env bash
# Installs what the benchmark's peers need, outside the project venv (idempotent):
#   - amqtt, pinned, in its own venv bench/.venv-amqtt, so its dependencies (pydantic, typer,
#     websockets, ...) never mix with the project's;
#   - pysyncobj, pinned, in its own venv bench/.venv-pysyncobj (raft_bench.py's peer);
#   - Mosquitto from Debian, if it is missing and we may use apt;
#   - RabbitMQ (Debian's rabbitmq-server, 3.10 on bookworm, for cluster_bench.py), likewise.
set -euo pipefail
cd "$(dirname "$0")"

AMQTT_VERSION="0.12.1"  # newest on PyPI; runs on Python 3.11
VENV=.venv-amqtt
PYTHON="${PYTHON:-python3}"

if [ "$("$VENV/bin/amqtt" --version 2>/dev/null || true)" != "$AMQTT_VERSION" ]; then
    rm -rf "$VENV"
    "$PYTHON" -m venv "$VENV"
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "amqtt==$AMQTT_VERSION"
fi
echo "amqtt $("$VENV/bin/amqtt" --version) in bench/$VENV"

PYSYNCOBJ_VERSION="0.3.17"  # newest on PyPI; raft_bench.py runs raft_worker.py in this venv
PYSYNCOBJ_VENV=.venv-pysyncobj
pysyncobj_version() {
    "$PYSYNCOBJ_VENV/bin/python" -c \
        "import importlib.metadata as m; print(m.version('pysyncobj'))" 2>/dev/null || true
}
if [ "$(pysyncobj_version)" != "$PYSYNCOBJ_VERSION" ]; then
    rm -rf "$PYSYNCOBJ_VENV"
    "$PYTHON" -m venv "$PYSYNCOBJ_VENV"
    "$PYSYNCOBJ_VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
        "pysyncobj==$PYSYNCOBJ_VERSION"
fi
echo "pysyncobj $(pysyncobj_version) in bench/$PYSYNCOBJ_VENV"

# Debian starts a system service on install; the benchmarks run their own instances, so it
# is stopped and disabled at once (where there is no systemd, the init script stops it).
debian_install() {  # debian_install PACKAGE SERVICE BINARY
    if [ -x "$3" ]; then
        return
    fi
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$1"
        systemctl disable --now "$2" >/dev/null 2>&1 || service "$2" stop >/dev/null 2>&1 \
            || true
    else
        echo "warning: $3 missing; install Debian's $1 package" >&2
    fi
}

debian_install mosquitto mosquitto /usr/sbin/mosquitto
/usr/sbin/mosquitto -h 2>/dev/null | head -n 1 || true

debian_install rabbitmq-server rabbitmq-server /usr/sbin/rabbitmq-server
# Its postinst leaves an epmd listening on every address; cluster_bench.py starts its own on
# loopback. `epmd -kill` refuses while any Erlang node is registered, so a running node
# (a benchmark's, or anyone's) keeps its epmd.
if command -v epmd >/dev/null; then epmd -kill >/dev/null 2>&1 || true; fi
# The MQTT plugin ships with the server; the benchmark enables it per node (its own
# enabled_plugins file), so nothing is enabled system-wide here.
dpkg-query -W -f='rabbitmq-server ${Version}\n' rabbitmq-server 2>/dev/null || true
