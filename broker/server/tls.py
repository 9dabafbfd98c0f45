"""The TLS listener's context, and who a client certificate says its holder is.

One SSLContext for the listener's life: re-reading the certificate chain into it on SIGHUP,
or when the files change (cert-manager renews a Kubernetes Secret, and kubelet swaps the
mounted files in place; nobody is there to send a signal), serves new handshakes with the
new certificate while established connections keep theirs.
"""

import logging
import os
import ssl
from typing import Any

from broker.config.loader import Config

log = logging.getLogger(__name__)

_PREFIX = "listeners.ssl.default.ssl_options."


def tls_context(config: Config) -> ssl.SSLContext | None:
    certfile, keyfile = config[_PREFIX + "certfile"], config[_PREFIX + "keyfile"]
    if not certfile or not keyfile or config["listeners.ssl.default.bind"] is None:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(certfile, keyfile)
    if config[_PREFIX + "verify"] == "verify_peer":
        if config[_PREFIX + "cacertfile"]:
            context.load_verify_locations(config[_PREFIX + "cacertfile"])
        context.verify_mode = (ssl.CERT_REQUIRED if config[_PREFIX + "fail_if_no_peer_cert"]
                               else ssl.CERT_OPTIONAL)
    return context


def reload_certificate(context: ssl.SSLContext, config: Config) -> bool:
    """Whether the files were loaded; a pair that fails (a key that does not match, a file
    half written) leaves the previous certificate in force."""
    try:
        context.load_cert_chain(config[_PREFIX + "certfile"], config[_PREFIX + "keyfile"])
    except (OSError, ssl.SSLError) as error:
        log.error("reloading the TLS certificate failed, the previous one stays: %s", error)
        return False
    log.info("reloaded the TLS certificate %s", config[_PREFIX + "certfile"])
    return True


class CertificateWatch:
    """Reloads the certificate when its or its key's file changes: a stat of each per
    `check`. The identity of what a path leads to (inode, size, mtime) changes with kubelet's
    symlink swap as with a rewrite. A reload that failed is tried again at the next check:
    the two files of a renewal may be seen one before the other."""

    def __init__(self, context: ssl.SSLContext, config: Config) -> None:
        self._context, self._config = context, config
        self._seen = self._identity()

    def _identity(self) -> tuple[tuple[int, int, int], ...] | None:
        try:
            stats = [os.stat(self._config[_PREFIX + name]) for name in ("certfile", "keyfile")]
        except OSError:
            return None
        return tuple((st.st_ino, st.st_size, st.st_mtime_ns) for st in stats)

    def check(self) -> None:
        now = self._identity()
        if now is not None and now != self._seen and reload_certificate(
                self._context, self._config):
            self._seen = now


def certificate_user(transport: Any, mode: str) -> str | None:
    """`cn` or `dn` of the client's verified certificate; None without one (a plain TCP
    connection, or TLS without a client certificate)."""
    certificate = transport.get_extra_info("peercert")
    if not certificate:
        return None
    subject = [pair for rdn in certificate.get("subject", ()) for pair in rdn]
    if mode == "cn":
        names = [value for key, value in subject if key == "commonName"]
        return names[-1] if names else None
    return ",".join(f"{_SHORT.get(key, key)}={_escape(value)}" for key, value in reversed(subject))


_SHORT = {"commonName": "CN", "organizationName": "O", "organizationalUnitName": "OU",
          "countryName": "C", "stateOrProvinceName": "ST", "localityName": "L",
          "emailAddress": "emailAddress", "domainComponent": "DC"}


def _escape(value: str) -> str:
    """RFC 4514's special characters, so a subject value cannot forge another attribute."""
    escaped = "".join("\\" + ch if ch in ',+"\\<>;=' else ch for ch in value)
    if escaped.startswith(("#", " ")):
        escaped = "\\" + escaped
    return escaped[:-1] + "\\ " if escaped.endswith(" ") else escaped
