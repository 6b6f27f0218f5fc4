"""OpenID Connect ID tokens checked as the Core spec's section 3.1.3.7 asks: a compact JWS signed RS256 by a key of
the provider's JWKS (named by `kid`), the issuer exactly the configured one, our client id in the audience (and as
`azp` when there are several), not expired, issued no later than now (60 s of clock skew each way), and the nonce
that this sign-in sent. Only RS256: `none` and HMAC algorithms (which a JWKS' public key would turn into a shared
secret) are refused. Uses `cryptography` for the signature; no JWT library."""

from __future__ import annotations

import base64
import hmac
from typing import Any

import msgspec
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import padding, rsa

SKEW_S = 60.0
MAX_TOKEN = 16384


class IdTokenRefused(ValueError):
    """The ID token is not one this sign-in may accept; the message says which check failed."""


def b64url(data: str) -> bytes:
    return base64.urlsafe_b64decode(data + "=" * (-len(data) % 4))


def _int(data: str) -> int:
    return int.from_bytes(b64url(data), "big")


def _public_key(jwks: dict[str, Any], kid: str | None) -> rsa.RSAPublicKey:
    keys = [k for k in jwks.get("keys", []) if isinstance(k, dict) and k.get("kty") == "RSA"
            and k.get("use", "sig") == "sig" and (kid is None or k.get("kid") == kid)]
    if len(keys) != 1:
        raise IdTokenRefused("the provider's JWKS has no single RSA signing key with the token's kid")
    try:
        return rsa.RSAPublicNumbers(_int(keys[0]["e"]), _int(keys[0]["n"])).public_key()
    except (KeyError, TypeError, ValueError) as exc:
        raise IdTokenRefused("the provider's JWKS key is malformed") from exc


def verify(token: str, jwks: dict[str, Any], *, issuer: str, client_id: str, nonce: str, now: float) -> dict[str, Any]:
    """The token's claims once every check passed; IdTokenRefused otherwise."""
    if not isinstance(token, str) or len(token) > MAX_TOKEN or token.count(".") != 2:
        raise IdTokenRefused("not a compact JWS")
    head, body, signature = token.split(".")
    try:
        header = msgspec.json.decode(b64url(head))
        claims = msgspec.json.decode(b64url(body))
        raw_signature = b64url(signature)
    except (ValueError, msgspec.DecodeError) as exc:
        raise IdTokenRefused("not a compact JWS") from exc
    if not isinstance(header, dict) or not isinstance(claims, dict) or header.get("alg") != "RS256":
        raise IdTokenRefused("only RS256 ID tokens are accepted")
    key = _public_key(jwks, header.get("kid"))
    try:
        key.verify(raw_signature, f"{head}.{body}".encode(), padding.PKCS1v15(),
                                                    hashes.SHA256())
    except (InvalidSignature, ValueError, KeyError, TypeError) as exc:
        raise IdTokenRefused("the signature does not verify against the provider's keys") from exc
    audience = claims.get("aud")
    audiences = audience if isinstance(audience, list) else [audience]
    if claims.get("iss") != issuer:
        raise IdTokenRefused("the issuer is not the configured provider")
    if client_id not in audiences or (len(audiences) > 1 and claims.get("azp") != client_id):
        raise IdTokenRefused("the token was not issued to this client")
    exp, iat = claims.get("exp"), claims.get("iat")
    if not isinstance(exp, int | float) or exp + SKEW_S < now:
        raise IdTokenRefused("the token has expired")
    if not isinstance(iat, int | float) or iat - SKEW_S > now:
        raise IdTokenRefused("the token was issued in the future")
    if not isinstance(claims.get("nonce"), str) or not hmac.compare_digest(claims["nonce"], nonce):
        raise IdTokenRefused("the nonce is not this sign-in's")
    return claims
