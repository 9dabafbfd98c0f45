#!/usr/bin/env bash
# Installs what the benchmark's peers need, outside the project venv (idempotent):
#   - amqtt, pinned, in its own venv bench/.venv-amqtt, so its dependencies (pydantic, typer,
#     websockets, ...) never mix with the project's;
#   - pysyncobj, pinned, in its own venv bench/.venv-pysyncobj (raft_bench.py's peer);
#   - Mosquitto from Debian, if it is missing and we may use apt.
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

if [ ! -x /usr/sbin/mosquitto ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mosquitto
        # Debian starts a system service on install; the benchmark runs its own instances.
        systemctl disable --now mosquitto >/dev/null 2>&1 || true
    else
        echo "warning: /usr/sbin/mosquitto missing; install Debian's mosquitto package" >&2
    fi
fi
/usr/sbin/mosquitto -h 2>/dev/null | head -n 1 || true
