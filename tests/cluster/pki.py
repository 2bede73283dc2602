"""The test cluster's credentials, made fresh at each start: a CA, the API server's and the kubelet's serving
certificates, the service-account signing key, static bearer tokens (`--token-auth-file`) for the people and the
controllers, and a client certificate for each node of the process kubelet, issued when a kubelet registers it
(`system:node:<name>` in `system:nodes`, what the Node authorizer and NodeRestriction act on).

Keys are ECDSA P-256: quick to make (RSA 2048 takes ~0.1 s a key on these cores) and accepted everywhere here,
the ES256 service-account tokens included."""

from __future__ import annotations

import datetime
import ipaddress
import secrets
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

# The first address of --service-cluster-ip-range: the `kubernetes` Service's ClusterIP, in the serving certificate.
SERVICE_CIDR = "10.96.0.0/16"
SERVICE_IP = "10.96.0.1"
API_SERVER_NAMES = ("localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
                    "kubernetes.default.svc.cluster.local")
VALIDITY = datetime.timedelta(days=7)

ADMIN_USER = "flywheel-admin"  # system:masters: the kubeconfig `up` writes


@dataclass(frozen=True)
class Token:
    token: str
    user: str
    groups: tuple[str, ...]


@dataclass(frozen=True)
class Pki:
    directory: Path
    tokens: dict[str, Token]  # by role: admin, kube-controller-manager, kube-scheduler

    @property
    def ca_cert(self) -> Path:
        return self.directory / "ca.crt"

    @property
    def ca_key(self) -> Path:
        return self.directory / "ca.key"

    def cert(self, name: str) -> Path:
        return self.directory / f"{name}.crt"

    def key(self, name: str) -> Path:
        return self.directory / f"{name}.key"

    @property
    def service_account_key(self) -> Path:
        return self.directory / "sa.key"

    @property
    def service_account_pub(self) -> Path:
        return self.directory / "sa.pub"

    @property
    def token_file(self) -> Path:
        return self.directory / "tokens.csv"

    def node_credentials(self, node: str) -> tuple[Path, Path]:
        """The node's client certificate and key (made on first use): a kubelet may register nodes at any time."""
        return self._issued(f"node-{node}", f"system:node:{node}", [ExtendedKeyUsageOID.CLIENT_AUTH],
                            organization="system:nodes")

    def kubelet_serving(self, node: str, ip: str) -> tuple[Path, Path]:
        """A real node's kubelet serving certificate for its address (made on first use): what the API server,
        holding the CA (--kubelet-certificate-authority), verifies when it proxies logs and exec to the node."""
        return self._issued(f"kubelet-{node}", f"system:node:{node}", [ExtendedKeyUsageOID.SERVER_AUTH],
                            dns=(node,), ips=(ip,))

    def _issued(self, name: str, subject: str, usage: list[x509.ObjectIdentifier], dns: tuple[str, ...] = (),
                ips: tuple[str, ...] = (), organization: str = "") -> tuple[Path, Path]:
        """The certificate and key `name`, signed by the CA the first time they are asked for."""
        cert, key_path = self.cert(name), self.key(name)
        if not cert.exists():
            ca = x509.load_pem_x509_certificate(self.ca_cert.read_bytes())
            ca_key = serialization.load_pem_private_key(self.ca_key.read_bytes(), None)
            assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
            key = _key()
            _write_key(key_path, key)
            _write_cert(cert, _certificate(subject, key, (ca, ca_key), usage, dns, ips, organization))
        return cert, key_path


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    path.chmod(0o600)


Issuer = tuple[x509.Certificate, ec.EllipticCurvePrivateKey]


def _certificate(subject: str, key: ec.EllipticCurvePrivateKey, issuer: Issuer | None,
                 usage: list[x509.ObjectIdentifier] | None = None, dns: tuple[str, ...] = (),
                 ips: tuple[str, ...] = (), organization: str = "") -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC) - datetime.timedelta(minutes=5)  # clock skew between processes
    attributes = [x509.NameAttribute(NameOID.COMMON_NAME, subject)]
    if organization:
        attributes.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization))
    name = x509.Name(attributes)
    issuer_cert, issuer_key = issuer if issuer else (None, key)
    builder = (x509.CertificateBuilder().subject_name(name)
               .issuer_name(issuer_cert.subject if issuer_cert else name)
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now).not_valid_after(now + VALIDITY)
               .add_extension(x509.BasicConstraints(ca=issuer is None, path_length=None), critical=True))
    if issuer is None:
        builder = builder.add_extension(x509.KeyUsage(True, False, False, False, False, True, True, False, False),
                                        critical=True)
    else:
        builder = builder.add_extension(x509.KeyUsage(True, True, False, False, False, False, False, False, False),
                                        critical=True)
    if usage:
        builder = builder.add_extension(x509.ExtendedKeyUsage(usage), critical=False)
    if dns or ips:
        names: list[x509.GeneralName] = [x509.DNSName(d) for d in dns]
        names += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def _write_cert(path: Path, cert: x509.Certificate) -> None:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def make_pki(directory: Path) -> Pki:
    """Write everything the control plane and the kubelet need into `directory` (created)."""
    directory.mkdir(parents=True, exist_ok=True)
    ca_key = _key()
    ca = _certificate("flywheel-test-ca", ca_key, None)
    pki = Pki(directory, _tokens())
    _write_key(pki.ca_key, ca_key)
    _write_cert(pki.ca_cert, ca)
    serving = [ExtendedKeyUsageOID.SERVER_AUTH]
    for name, dns, ips, usage, org in (
            ("apiserver", API_SERVER_NAMES, ("127.0.0.1", SERVICE_IP), serving, ""),
            ("kubelet", ("localhost",), ("127.0.0.1",), serving, ""),
            ("apiserver-kubelet-client", (), (), [ExtendedKeyUsageOID.CLIENT_AUTH], "system:masters")):
        key = _key()
        _write_key(pki.key(name), key)
        _write_cert(pki.cert(name), _certificate(f"flywheel-{name}", key, (ca, ca_key), usage, dns, ips, org))
    signing = _key()
    _write_key(pki.service_account_key, signing)
    pki.service_account_pub.write_bytes(signing.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    pki.token_file.write_text("".join(f'{t.token},{t.user},{t.user},"{",".join(t.groups)}"\n'
                                      for t in pki.tokens.values()))
    pki.token_file.chmod(0o600)
    return pki


def _tokens() -> dict[str, Token]:
    """The static identities; the bootstrap RBAC policy already binds the controller manager's and scheduler's
    user names."""
    def new(user: str, *groups: str) -> Token:
        return Token(secrets.token_hex(16), user, groups)
    tokens = {"admin": new(ADMIN_USER, "system:masters"),
              "kube-controller-manager": new("system:kube-controller-manager"),
              "kube-scheduler": new("system:kube-scheduler")}
    return tokens
