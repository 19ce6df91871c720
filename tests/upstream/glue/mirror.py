"""A local HTTPS mirror for the few remote files webdataset's and wids' own tests download.

Written for sharedfs's tests/upstream/run.py.  Those tests fetch shards from
storage.googleapis.com with ``curl`` (webdataset's gopen and wids' download commands both run
curl), which CI cannot reach.  Instead of deselecting them, run.py serves stand-in files from
127.0.0.1 and points curl there with a ``.curlrc`` in ``CURL_HOME`` (``connect-to`` the mirror,
``insecure`` for its self-signed certificate).  The frameworks' code and the tests' URLs are
unchanged: only the name resolution of curl is.  The files are ours, built from what the tests
assert (a gzip stream; a tar whose first bytes are a PAX header); each test still goes through
the real download, lock and cache code of the framework, with and without sharedfs.
"""

from __future__ import annotations

import gzip
import http.server
import io
import shutil
import ssl
import subprocess
import tarfile
import threading
from pathlib import Path

HOST = "storage.googleapis.com"


def _tar(members: dict[str, bytes], pax: bool = False) -> bytes:
    buffer = io.BytesIO()
    kwargs = {"format": tarfile.PAX_FORMAT, "pax_headers": {"comment": "sharedfs upstream mirror"}} if pax else {}
    with tarfile.open(fileobj=buffer, mode="w", **kwargs) as archive:
        for name, payload in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(payload)
            info.mtime = 1_700_000_000
            archive.addfile(info, io.BytesIO(payload))
    return buffer.getvalue()


def files() -> dict[str, bytes]:
    """URL path on HOST -> body."""
    imagenet = _tar({f"{i:06d}.cls": str(i % 10).encode() for i in range(10)})
    tokens = {f"{i:06d}.tokens": bytes(range(256)) * 4 for i in range(20)}
    return {
        "/webdataset/testdata/imagenet-000000.tgz": gzip.compress(imagenet, mtime=0),
        "/webdataset/d-tokens/d-tokens-000000.tar": _tar(tokens, pax=True),
        "/webdataset/d-tokens/d-tokens-000002.tar": _tar(tokens, pax=True),
    }


def certificate(directory: Path) -> tuple[Path, Path]:
    cert, key = directory / "mirror-cert.pem", directory / "mirror-key.pem"
    if not (cert.exists() and key.exists()):
        openssl = shutil.which("openssl")
        if openssl is None:
            raise RuntimeError("openssl not found: cannot make the local mirror's certificate")
        directory.mkdir(parents=True, exist_ok=True)
        subprocess.run([openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "3650",
                        "-keyout", str(key), "-out", str(cert), "-subj", f"/CN={HOST}"],
                       check=True, capture_output=True, timeout=120)
    return cert, key


class Mirror:
    """Serve ``files()`` over HTTPS on 127.0.0.1; ``env`` points curl at it."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.requests: list[str] = []
        self.env: dict[str, str] = {}

    def __enter__(self) -> "Mirror":
        bodies = files()
        requests = self.requests

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 - http.server's naming
                requests.append(self.path)
                body = bodies.get(self.path.split("?")[0])
                if body is None:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Type", "application/octet-stream")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        cert, key = certificate(self.workdir.parent)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        port = self.server.server_address[1]
        curl_home = self.workdir / "curl_home"
        curl_home.mkdir(parents=True, exist_ok=True)
        (curl_home / ".curlrc").write_text(f'connect-to = "{HOST}:443:127.0.0.1:{port}"\ninsecure\n')
        self.env = {"CURL_HOME": str(curl_home)}
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
