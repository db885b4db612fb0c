"""A private certificate authority for tests: a CA, and a server certificate it signed for 127.0.0.1 and localhost,
written as PEM files; ``server_context`` is the ``ssl.SSLContext`` a test server (``FaultProxy(ssl_context=...)``)
serves them with. Made with ``cryptography`` (installed with moto), in a second, nothing checked in.

    ca_file, context = private_ca(tmp_path)
    proxy = FaultProxy(upstream, ssl_context=context)   # https://127.0.0.1:PORT, trusted only with ca_file
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import ssl


def private_ca(folder) -> tuple[str, ssl.SSLContext]:
    """``(the CA's PEM file, a server SSLContext holding a certificate it signed for 127.0.0.1 and localhost)``."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key, server_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "tfshard test CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
          .not_valid_after(now + datetime.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                       content_commitment=False, key_encipherment=False, data_encipherment=False,
                                       key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
          .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
          .sign(ca_key, hashes.SHA256()))
    server = (x509.CertificateBuilder()
              .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
              .issuer_name(ca_name).public_key(server_key.public_key()).serial_number(x509.random_serial_number())
              .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
              .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                                                          x509.DNSName("localhost")]), critical=False)
              .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
              .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
              .sign(ca_key, hashes.SHA256()))
    pem = serialization.Encoding.PEM
    paths = {name: os.path.join(folder, f"{name}.pem") for name in ("ca", "server", "server-key")}
    for name, data in (("ca", ca.public_bytes(pem)), ("server", server.public_bytes(pem)),
                       ("server-key", server_key.private_bytes(pem, serialization.PrivateFormat.PKCS8,
                                                               serialization.NoEncryption()))):
        with open(paths[name], "wb") as f:
            f.write(data)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(paths["server"], paths["server-key"])
    return paths["ca"], context
