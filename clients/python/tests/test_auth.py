"""Bearer token and TLS on the daemon's TCP listener, from the Python client.

Runs when the daemon binary has ``--auth-token-file`` and ``--tls-cert`` (skipped with the reason
otherwise); the certificate is a throwaway self-signed one made with the openssl CLI.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

import vserve_client
from conftest import Daemon, supports

TOKEN = "s3cret-token-for-tests"


@pytest.fixture(scope="module")
def secured():
    if not (supports("--auth-token-file") and supports("--tls-cert")):
        pytest.skip("this daemon binary has no --auth-token-file/--tls-cert")
    if shutil.which("openssl") is None:
        pytest.skip("no openssl CLI to make a test certificate")
    root = Path(tempfile.mkdtemp(prefix="vserve-auth"))
    (root / "token").write_text(TOKEN + "\n")
    subprocess.run(
        [
            "openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-keyout", str(root / "key.pem"), "-out", str(root / "cert.pem"), "-days", "2",
            "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1",
        ],
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    d = Daemon(
        root,
        extra=[
            "--auth-token-file", str(root / "token"),
            "--tls-cert", str(root / "cert.pem"),
            "--tls-key", str(root / "key.pem"),
        ],
    )
    yield d, root
    d.stop()
    shutil.rmtree(root, ignore_errors=True)


def test_token_and_tls_on_tcp(secured):
    d, root = secured
    port = d.tcp_addr.rsplit(":", 1)[1]
    https = f"https://localhost:{port}"
    ca = root / "cert.pem"
    with vserve_client.Client(https, token=TOKEN, tls_ca=ca, timeout=10) as c:
        assert {"media", "scratch", "clips"} <= {x["name"] for x in c.list_datasets()}
        batch = c.get_clips("scratch", [("ok.mov", [0, 3])])
        assert batch.array.shape[:2] == (1, 2)
    with vserve_client.Client(https, tls_ca=ca.read_bytes(), timeout=10) as c:
        with pytest.raises(vserve_client.Unauthenticated):
            c.list_datasets()
    with vserve_client.Client(https, token="wrong", tls_ca=ca, timeout=10) as c:
        with pytest.raises(vserve_client.Unauthenticated) as e:
            c.get_clips("scratch", [("ok.mov", [0])])
        assert e.value.code == "UNAUTHENTICATED"
    # Plaintext to a TLS listener does not get through.
    with vserve_client.Client(d.tcp_addr, token=TOKEN, timeout=5) as c:
        with pytest.raises(vserve_client.VServeError):
            c.list_datasets()


def test_unix_socket_needs_no_token(secured):
    d, _ = secured
    with vserve_client.Client(d.addr) as c:
        assert c.get_clips("scratch", [("ok.mov", [1])]).array.shape[:2] == (1, 1)


def test_tls_arguments_are_checked(tmp_path):
    with pytest.raises(vserve_client.InvalidArgument, match="not https"):
        vserve_client.Client("localhost:1", tls_ca=b"pem")
    with pytest.raises(vserve_client.InvalidArgument, match="tls_ca="):
        vserve_client.Client("https://localhost:1", tls_ca=tmp_path / "missing.pem")


def test_token_is_never_sent_in_clear_to_another_host():
    # Refused before any connection is made: no daemon is needed.
    with pytest.raises(vserve_client.InvalidArgument, match="unencrypted"):
        vserve_client.Client("10.1.2.3:7070", token="secret")
    with pytest.raises(vserve_client.InvalidArgument, match="unencrypted"):
        vserve_client.Client("http://trainer-7.example:7070", token="secret")
    # Loopback, Unix sockets and TLS are fine (channels connect lazily).
    for addr in ("127.0.0.1:7070", "localhost:7070", "[::1]:7070", "unix:/tmp/x.sock", "https://10.1.2.3:7070"):
        vserve_client.Client(addr, token="secret").close()
