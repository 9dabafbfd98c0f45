#!/usr/bin/env bash
# Installs what the benchmark's peers need, outside the project venv (idempotent):
#   - amqtt, pinned, in its own venv bench/.venv-amqtt, so its dependencies (pydantic, typer,
#     websockets, ...) never mix with the project's;
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
