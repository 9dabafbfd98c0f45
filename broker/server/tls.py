"""The TLS listener's context, and who a client certificate says its holder is.

The listener keeps one SSLContext for its life, but each new handshake is moved (in the
ClientHello callback, which runs with or without SNI) to the context built from the files
as they are now. Files change when cert-manager renews a Kubernetes Secret and kubelet swaps
the mounted files in place, with nobody there to send a signal; so they are watched, and
read again on SIGHUP too. A new context, not a reload into the old one, because a context
can only add CAs: a rotated `ca.crt` must also drop the CA it replaces. Established
connections keep the context they were made with.
"""

import logging
import os
import ssl
from typing import Any

from broker.config.loader import Config

log = logging.getLogger(__name__)

_PREFIX = "listeners.ssl.default.ssl_options."
_FILES = ("certfile", "keyfile", "cacertfile")


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


class CertificateWatch:
    """The context new handshakes get (`listener`'s ClientHello callback hands it out),
    made again from the files when the certificate's, the key's or the CA file's identity
    (inode, size, mtime: kubelet's symlink swap changes it as a rewrite does) changes, a
    stat of each per `check`, or on `reload`. Files that fail to load (a key that does not
    match, a file half written, the two files of a renewal seen one before the other)
    leave the previous context in force and are tried again at the next check."""

    def __init__(self, listener: ssl.SSLContext, config: Config) -> None:
        self._config = config
        self._current = listener
        self._seen = self._identity()
        listener.sni_callback = self._choose

    def _choose(self, connection: ssl.SSLObject, _server_name: str | None,
                context: ssl.SSLContext) -> None:
        if self._current is not context:
            connection.context = self._current

    def _identity(self) -> tuple[tuple[int, int, int], ...] | None:
        try:
            stats = [os.stat(path) for name in _FILES if (path := self._config[_PREFIX + name])]
        except OSError:
            return None
        return tuple((st.st_ino, st.st_size, st.st_mtime_ns) for st in stats)

    def reload(self) -> bool:
        """Whether the files were loaded (into a new context for new handshakes)."""
        try:
            context = tls_context(self._config)
        except (OSError, ssl.SSLError) as error:
            log.error("reloading the TLS certificate failed, the previous one stays: %s", error)
            return False
        assert context is not None  # the listener exists, so its settings are there
        self._current = context
        log.info("reloaded the TLS certificate %s", self._config[_PREFIX + "certfile"])
        return True

    def check(self) -> None:
        now = self._identity()
        if now is not None and now != self._seen and self.reload():
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
