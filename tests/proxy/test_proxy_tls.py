"""TLS towards clients and towards brokers, with a real client: a chain of two kinspects in front of Tansu.

Tansu 0.6.0's own TLS cannot be enabled from its command line (--cert and --key conflict),
so the TLS broker endpoint is a second kinspect that terminates TLS in front of Tansu:
client --TLS--> kinspect A (tls.client + tls.broker) --TLS--> kinspect B (tls.client) --> Tansu.
"""

from __future__ import annotations

import datetime
import ipaddress
import logging
import socket
import ssl
import struct
import time

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from kinspect.session import Request
from tests.support.proxy_harness import ProxyHarness, api_versions
from tests.support.tansu import TansuBroker, free_port

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    """A throw-away CA and a server certificate for 127.0.0.1 and localhost."""
    out = tmp_path_factory.mktemp("tls")
    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (x509.CertificateBuilder().subject_name(_name("kinspect test CA")).issuer_name(_name("kinspect test CA"))
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder().subject_name(_name("localhost")).issuer_name(ca.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                        x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    pem = serialization.Encoding.PEM
    (out / "ca.pem").write_bytes(ca.public_bytes(pem))
    (out / "server.pem").write_bytes(cert.public_bytes(pem))
    (out / "server.key").write_bytes(key.private_bytes(pem, serialization.PrivateFormat.PKCS8,
                                                       serialization.NoEncryption()))
    return {name: str(out / f) for name, f in (("ca", "ca.pem"), ("cert", "server.pem"), ("key", "server.key"))}


def _tls_server(certs) -> dict:
    return {"tls.client.enabled": True, "tls.client.cert_file": certs["cert"], "tls.client.key_file": certs["key"]}


def _chain(certs, broker_tls: dict):
    """Tansu advertising A's address; B terminates TLS in front of Tansu; A speaks TLS on both sides."""
    a_port, b_port = free_port(), free_port()
    broker = TansuBroker(advertised_port=a_port).start()
    b = ProxyHarness({"proxy.listen": f"127.0.0.1:{b_port}", "proxy.upstream": broker.bootstrap, **_tls_server(certs)})
    a = ProxyHarness({"proxy.listen": f"127.0.0.1:{a_port}", "proxy.upstream": f"127.0.0.1:{b_port}",
                      **_tls_server(certs), "tls.broker.enabled": True, **broker_tls})
    return broker, b, a


def test_tls_on_both_sides_with_a_real_client(certs):
    from kafka import KafkaConsumer, KafkaProducer
    from kafka.admin import KafkaAdminClient, NewTopic

    broker, b, a = _chain(certs, {"tls.broker.ca_file": certs["ca"]})
    try:
        b.start(), a.start()
        ssl_args = {"security_protocol": "SSL", "ssl_cafile": certs["ca"], "ssl_check_hostname": True}
        bootstrap = f"127.0.0.1:{a.server.bootstrap_port}"
        admin = KafkaAdminClient(bootstrap_servers=bootstrap, **ssl_args)
        admin.create_topics([NewTopic("secure", 1, 1)])
        admin.close()
        producer = KafkaProducer(bootstrap_servers=bootstrap, **ssl_args)
        values = [f"value-{i}".encode() for i in range(20)]
        for v in values:
            producer.send("secure", v)
        producer.flush(30)
        producer.close()
        consumer = KafkaConsumer("secure", bootstrap_servers=bootstrap, auto_offset_reset="earliest",
                                 consumer_timeout_ms=10000, **ssl_args)
        got = [m.value for m in consumer]
        consumer.close()
        assert got == values
        # A saw the decrypted Kafka traffic and decoded it.
        produced = [e for e in a.events.events if isinstance(e, Request) and e.api_name == "Produce"]
        assert produced and sum(len(p["PartitionData"]) for e in produced for p in e.decode().body["TopicData"]) >= 1
        assert a.server.connections_total >= 2 and b.server.connections_total >= 2
    finally:
        a.stop(), b.stop(), broker.stop()


def _tls_client_roundtrip(port: int, ca: str) -> bytes:
    from kinspect.protocol.codec import Codec

    context = ssl.create_default_context(cafile=ca)
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
        with context.wrap_socket(raw, server_hostname="127.0.0.1") as s:
            s.sendall(api_versions(Codec(), 1))
            s.settimeout(5)
            try:
                return s.recv(4)
            except (ConnectionError, ssl.SSLError, socket.timeout):
                return b""


def test_broker_certificates_are_verified_by_default(certs):
    """Without the CA that signed the broker's certificate, A refuses the broker and closes the client."""
    broker, b, a = _chain(certs, {})  # tls.broker.verify defaults to true; system CAs only
    try:
        b.start(), a.start()
        started = time.monotonic()
        assert _tls_client_roundtrip(a.server.bootstrap_port, certs["ca"]) == b""
        assert time.monotonic() - started < 5
        a.wait_until(lambda: not a.server.relays)  # the client's connection was closed
        assert not [e for e in a.events.events if type(e).__name__ == "Response"]
    finally:
        a.stop(), b.stop(), broker.stop()


def test_disabled_verification_works_and_warns(certs, caplog):
    with caplog.at_level(logging.WARNING, logger="kinspect.proxy"):
        broker, b, a = _chain(certs, {"tls.broker.verify": False})
    try:
        assert any("verification towards brokers is DISABLED" in r.getMessage() for r in caplog.records)
        b.start(), a.start()
        data = _tls_client_roundtrip(a.server.bootstrap_port, certs["ca"])
        assert len(data) == 4 and struct.unpack(">i", data)[0] > 0
    finally:
        a.stop(), b.stop(), broker.stop()
