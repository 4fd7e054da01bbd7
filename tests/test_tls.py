"""HTTPS: the server on uvicorn's TLS with a certificate made here, an agent that verifies it with --ca, and one
that does not trust it and so sends nothing."""
from __future__ import annotations

import datetime as dt
import ipaddress
import subprocess
from pathlib import Path

import pytest
import requests
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from gpuledger.analytics.config import Config
from gpuledger.analytics.store import Store
from gpuledger.deploy.server import ApiServer
from tests.procs import GPULEDGER, TOKEN, AgentProc, wait_until


def make_certificate(folder: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 and localhost, valid for a day: (certificate, key) PEM files."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gpuledger test")])
    now = dt.datetime.now(dt.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                        x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = folder / "server.pem", folder / "server-key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


def test_agents_push_over_https_only_when_they_trust_the_server(tmp_path):
    cert, key = make_certificate(tmp_path)
    with Store(tmp_path / "tls.duckdb") as store:
        server = ApiServer(store, Config(), port=0, token=TOKEN, tls=(cert, key))
        url = server.start()
        trusting = untrusting = None
        try:
            assert url.startswith("https://")
            with pytest.raises(requests.exceptions.SSLError):
                requests.get(url + "/healthz", timeout=10)  # not signed by a CA the system trusts
            assert requests.get(url + "/healthz", timeout=10, verify=str(cert)).ok
            trusting = AgentProc(tmp_path, "node-0001", url, interval_s=0.5,
                                 source=["--source", "simulator", "--ca", str(cert)]).start()
            untrusting = AgentProc(tmp_path, "node-0002", url, interval_s=0.5).start()
            wait_until(lambda: store.scalar("SELECT count(*) FROM samples WHERE node = 'node-0001'") > 0, 60,
                       "a batch over HTTPS")
            wait_until(lambda: untrusting.spooled() >= 3, 60, "the untrusting agent spooling")
            assert store.scalar("SELECT count(*) FROM samples WHERE node = 'node-0002'") == 0
            wait_until(lambda: "certificate verify failed" in untrusting.log.read_text(), 30, "the refusal logged")
        finally:
            for agent in (trusting, untrusting):
                if agent is not None:
                    agent.proc.stop()
            server.stop()


def test_serve_needs_both_halves_of_tls(tmp_path):
    cert, _ = make_certificate(tmp_path)
    half = subprocess.run([GPULEDGER, "serve", "--create", "--source", "none", "--db", str(tmp_path / "x.duckdb"),
                           "--tls-cert", str(cert)], capture_output=True, text=True, timeout=60)
    assert half.returncode == 2 and "both --tls-cert and --tls-key" in half.stderr
