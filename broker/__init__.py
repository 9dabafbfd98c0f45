"""A durable MQTT 3.1.1 + 5.0 broker."""

from broker.native import check as _check_native

# Hot-path modules compiled by tools/build_native.py (0: pure Python); refuses stale ones.
COMPILED_MODULES = _check_native()
