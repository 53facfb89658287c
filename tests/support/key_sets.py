"""Keys of a JSON Web Key Set for tests: generated once each, published as a JWKS document,
in a file or by a local HTTP server."""

from __future__ import annotations

import contextlib
import functools
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from joserfc.jwk import ECKey, OctKey, RSAKey

from seckill.security.jwks import Algorithm


class SetKey:
    """One key of a set: its kid, the algorithm it is pinned to, what a JWKS publishes of it
    and (RS256, ES256) its private key as PEM."""

    def __init__(self, kid: str, alg: Algorithm) -> None:
        self.kid = kid
        self.alg = alg
        parameters: Any = {"kid": kid, "alg": alg, "use": "sig"}
        key: OctKey | RSAKey | ECKey
        if alg == "HS256":
            key = OctKey.generate_key(256, parameters=parameters)
        elif alg == "RS256":
            key = RSAKey.generate_key(2048, parameters=parameters)
        else:
            key = ECKey.generate_key("P-256", parameters=parameters)
        self.key = key
        # An oct key is published whole: the API needs the secret to check an HMAC.
        self.published: dict[str, Any] = dict(key.as_dict(private=alg == "HS256"))
        self.private_pem: bytes | None = None
        if not isinstance(key, OctKey):
            self.private_pem = key.as_pem(private=True)


@functools.cache
def set_key(kid: str, alg: Algorithm) -> SetKey:
    """The key named ``kid`` for ``alg``, the same one each time (RSA keys take a while)."""
    return SetKey(kid, alg)


def document(*keys: SetKey | dict[str, Any]) -> bytes:
    """A JWKS document publishing ``keys`` in this order."""
    members = [key.published if isinstance(key, SetKey) else key for key in keys]
    return json.dumps({"keys": members}).encode()


def write_document(path: Path, *keys: SetKey | dict[str, Any]) -> Path:
    path.write_bytes(document(*keys))
    return path


class Served:
    """What the local key server answers; replaced at will. Counts the requests."""

    def __init__(self, body: bytes) -> None:
        self.body = body
        self.status = 200
        self.requests = 0


@contextlib.contextmanager
def key_server(served: Served) -> Iterator[str]:
    """An HTTP server on 127.0.0.1 answering every GET with ``served``; yields its URL."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            served.requests += 1
            body = served.body
            self.send_response(served.status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/.well-known/jwks.json"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
