"""JWT authentication (`authentication.jwt.*`, EMQX's JWT authenticator). Pure: the key
material comes in as text, which `Security` reads from the config and files.

The token is the CONNECT's password (or user name, `authentication.jwt.from`). A value that
is not a JWT at all is passed on to the next source of `authentication.order`; a JWT that
fails (signature, algorithm, `exp`/`nbf` past the leeway, a claim of
`authentication.jwt.verify_claims`, an unreadable `acl` claim) refuses the CONNECT. Only the
algorithms of the configured kind are accepted, so a token signed with HS256 using the public
key as its secret is refused (the "alg confusion" attack). A signature check costs tens of
microseconds (RS256, ES256): it runs on the event loop.
"""

import base64
import json
from dataclasses import dataclass
from typing import Any, Final, NamedTuple

import jwt
from cryptography.hazmat.primitives.serialization import load_pem_public_key

from broker.auth.client_rules import ClientRule, ClientRulesError, parse_client_rules

HMAC_ALGORITHMS: Final = ("HS256", "HS384", "HS512")
PUBLIC_KEY_ALGORITHMS: Final = ("RS256", "RS384", "RS512", "ES256", "ES384", "ES512")


class JwtConfigError(ValueError):
    pass


class Verdict(NamedTuple):
    """`allowed` None: not a JWT, the next source decides."""

    allowed: bool | None
    reason: str  # a metric label when refused
    expires_at: float | None = None
    rules: tuple[ClientRule, ...] | None = None


_NOT_A_JWT: Final = Verdict(None, "not_a_jwt")


@dataclass(frozen=True, slots=True)
class JwtSettings:
    source: str  # "password" or "username"
    leeway: float
    verify_claims: dict[str, str]
    acl_claim_name: str


class JwtVerifier:
    """Keys by `kid` (None: the key for tokens without one) and the algorithms they take."""

    def __init__(self, settings: JwtSettings) -> None:
        self.settings = settings
        self._keys: dict[str | None, tuple[Any, tuple[str, ...]]] = {}

    def use_secret(self, secret: str, base64_encoded: bool) -> None:
        key = base64.b64decode(secret, validate=True) if base64_encoded else secret.encode()
        self._keys = {None: (key, HMAC_ALGORITHMS)}

    def use_public_key(self, pem: str) -> None:
        try:
            key = load_pem_public_key(pem.encode())
        except ValueError as error:
            raise JwtConfigError(f"authentication.jwt.public_key: {error}") from None
        self._keys = {None: (key, PUBLIC_KEY_ALGORITHMS)}

    def use_jwks(self, text: str, name: str) -> None:
        """A JWKS document (RFC 7517); replaced whole, or not at all if it fails."""
        try:
            keys = jwt.PyJWKSet.from_dict(json.loads(text)).keys
        except (ValueError, jwt.PyJWTError) as error:
            raise JwtConfigError(f"{name}: not a usable JWKS: {error}") from None
        table: dict[str | None, tuple[Any, tuple[str, ...]]] = {}
        for key in keys:
            algorithms = ((key.algorithm_name,) if key.algorithm_name in PUBLIC_KEY_ALGORITHMS
                          else PUBLIC_KEY_ALGORITHMS)
            table[key.key_id] = (key.key, algorithms)
        if len(keys) == 1:
            table[None] = table[keys[0].key_id]
        self._keys = table

    def verify(self, token: bytes, client_id: str, username: str | None) -> Verdict:
        try:
            text = token.decode("ascii")
        except UnicodeDecodeError:
            return _NOT_A_JWT
        if text.count(".") != 2:
            return _NOT_A_JWT
        try:
            header = jwt.get_unverified_header(text)
        except jwt.PyJWTError:
            return _NOT_A_JWT
        entry = self._keys.get(header.get("kid"))
        if entry is None:
            return Verdict(False, "unknown_key")
        key, algorithms = entry
        if header.get("alg") not in algorithms:
            return Verdict(False, "bad_algorithm")
        settings = self.settings
        try:
            claims = jwt.decode(text, key, algorithms=list(algorithms), leeway=settings.leeway,
                                options={"verify_aud": False, "verify_iss": False})
        except jwt.ExpiredSignatureError:
            return Verdict(False, "expired")
        except jwt.ImmatureSignatureError:
            return Verdict(False, "not_yet_valid")
        except jwt.InvalidSignatureError:
            return Verdict(False, "bad_signature")
        except jwt.PyJWTError:
            return Verdict(False, "malformed")
        for claim, expected in settings.verify_claims.items():
            wanted = expected.replace("${clientid}", client_id).replace(
                "${username}", username or "")
            if str(claims.get(claim)) != wanted:
                return Verdict(False, "claims")
        rules = None
        if settings.acl_claim_name in claims:
            try:
                rules = parse_client_rules(claims[settings.acl_claim_name], client_id, username)
            except ClientRulesError:
                return Verdict(False, "bad_acl")
        expires = claims.get("exp")
        return Verdict(True, "", float(expires) if isinstance(expires, int | float) else None,
                       rules)
