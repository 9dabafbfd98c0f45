"""JWT keys from a JWKS URL (EMQX's `authentication.jwt.endpoint`, `refresh_interval`): the
identity provider publishes its signing keys there and rotates them; the broker fetches the
document at start-up and every `refresh_interval`, in the background.

A fetch that fails (no answer in time, an error status, not a usable JWKS) keeps the keys in
force and is logged and counted (`mqtt_security_reloads_total{result="failed"}`); until the
first fetch succeeds no token can be checked (refused as `unknown_key`). CONNECTs never wait
for a fetch.
"""

import asyncio
import logging
from collections.abc import Callable
from typing import Final

import aiohttp

from broker.auth.tokens import JwtConfigError, JwtVerifier

log = logging.getLogger(__name__)

_MAX_DOCUMENT: Final = 1024 * 1024
_TIMEOUT: Final = 10.0


async def refresh_forever(url: str, interval: float, verifier: JwtVerifier,
                          counted: Callable[[str], None]) -> None:
    """`counted("ok" | "failed")` after each fetch."""
    timeout = aiohttp.ClientTimeout(total=min(_TIMEOUT, interval) if interval else _TIMEOUT)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        while True:
            try:
                async with session.get(url) as response:
                    body = await response.content.read(_MAX_DOCUMENT + 1)
                    if response.status != 200 or len(body) > _MAX_DOCUMENT:
                        raise JwtConfigError(f"{url}: HTTP {response.status},"
                                             f" {len(body)} bytes")
                verifier.use_jwks(body.decode(errors="replace"), url)
            except (TimeoutError, aiohttp.ClientError, JwtConfigError) as error:
                counted("failed")
                log.error("fetching the JWKS failed, the keys in force stay: %s", error)
            else:
                counted("ok")
                log.info("fetched the JWKS from %s", url)
            if not interval:
                return
            await asyncio.sleep(interval)
