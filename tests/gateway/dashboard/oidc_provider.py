"""A small OpenID Connect provider on a local port, in a thread, for the sign-in tests: discovery, an authorize
endpoint that signs in `email` at once (the person already has a session at the provider), a token endpoint
that checks the client's secret, the code (once) and the PKCE verifier (S256), and a JWKS with a real RSA key.
ID tokens are RS256 JWS made here with `cryptography`. Knobs let a test make the provider misbehave: sign with
another key under the same kid, send another nonce, vouch for an unverified address."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import secrets
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlencode, urlsplit

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import padding, rsa

CLIENT_ID, CLIENT_SECRET = "sluice-dashboard", "provider-client-secret"


def b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def sign_jwt(key: rsa.RSAPrivateKey, claims: dict, kid: str = "k1", alg: str = "RS256") -> str:
    head = b64(json.dumps({"alg": alg, "kid": kid, "typ": "JWT"}).encode())
    body = b64(json.dumps(claims).encode())
    signature = key.sign(f"{head}.{body}".encode(), padding.PKCS1v15(), hashes.SHA256())
    return f"{head}.{body}.{b64(signature)}"


def jwk(key: rsa.RSAPrivateKey, kid: str = "k1") -> dict:
    numbers = key.public_key().public_numbers()
    as_bytes = lambda n: n.to_bytes((n.bit_length() + 7) // 8, "big")  # noqa: E731
    return {"kty": "RSA", "use": "sig", "alg": "RS256", "kid": kid, "n": b64(as_bytes(numbers.n)),
            "e": b64(as_bytes(numbers.e))}


def new_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


@dataclass
class Provider:
    issuer: str = ""
    email: str = ""
    email_verified: bool = True
    key: rsa.RSAPrivateKey = field(default_factory=new_key)
    signing_key: rsa.RSAPrivateKey | None = None  # None: `key`; another: a forged signature under the same kid
    nonce: str | None = None  # None: the one the client sent
    codes: dict = field(default_factory=dict)  # code -> (challenge, nonce, redirect_uri)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def id_token(self, nonce: str) -> str:
        now = int(time.time())
        claims = {"iss": self.issuer, "sub": "provider-user-1", "aud": CLIENT_ID, "exp": now + 300, "iat": now,
                  "nonce": self.nonce if self.nonce is not None else nonce, "email": self.email,
                  "email_verified": self.email_verified}
        return sign_jwt(self.signing_key or self.key, claims)


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, *args) -> None:
        pass

    def _json(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        provider, url = self.server.provider, urlsplit(self.path)
        query = {k: v[0] for k, v in parse_qs(url.query).items()}
        if url.path == "/.well-known/openid-configuration":
            base = provider.issuer
            return self._json(200, {"issuer": base, "authorization_endpoint": f"{base}/authorize",
                                    "token_endpoint": f"{base}/token", "jwks_uri": f"{base}/jwks"})
        if url.path == "/jwks":
            return self._json(200, {"keys": [jwk(provider.key)]})
        if url.path == "/authorize":
            if (query.get("client_id") != CLIENT_ID or query.get("response_type") != "code"
                    or query.get("code_challenge_method") != "S256" or "openid" not in query.get("scope", "")):
                return self._json(400, {"error": "invalid_request"})
            code = secrets.token_urlsafe(16)
            with provider.lock:
                provider.codes[code] = (query["code_challenge"], query["nonce"], query["redirect_uri"])
            self.send_response(302)
            back = urlencode({"code": code, "state": query["state"]})
            self.send_header("location", f"{query['redirect_uri']}?{back}")
            self.send_header("content-length", "0")
            self.end_headers()
            return None
        return self._json(404, {"error": "not_found"})

    def do_POST(self) -> None:
        provider = self.server.provider
        form = {k: v[0] for k, v in parse_qs(self.rfile.read(int(self.headers["content-length"])).decode()).items()}
        basic = base64.b64encode(f"{CLIENT_ID}:{CLIENT_SECRET}".encode()).decode()
        if self.path != "/token" or self.headers.get("authorization") != f"Basic {basic}":
            return self._json(401, {"error": "invalid_client"})
        with provider.lock:
            found = provider.codes.pop(form.get("code", ""), None)  # a code works once
        if found is None or form.get("grant_type") != "authorization_code" or form.get("redirect_uri") != found[2]:
            return self._json(400, {"error": "invalid_grant"})
        if b64(hashlib.sha256(form.get("code_verifier", "").encode()).digest()) != found[0]:
            return self._json(400, {"error": "invalid_grant", "error_description": "PKCE verifier"})
        return self._json(200, {"access_token": "at", "token_type": "Bearer", "id_token": provider.id_token(found[1])})


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    provider: Provider


@contextlib.contextmanager
def oidc_provider(email: str) -> Iterator[Provider]:
    with _Server(("127.0.0.1", 0), _Handler) as server:
        server.provider = Provider(issuer=f"http://127.0.0.1:{server.server_address[1]}", email=email)
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            yield server.provider
        finally:
            server.shutdown()
            thread.join()
