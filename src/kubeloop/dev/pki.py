"""Certificates and credentials of the local control plane.

A private CA signs the API server's serving certificate, so clients verify
TLS instead of skipping it; one RSA key signs service-account tokens; static
bearer tokens identify the admin, the controller manager, the scheduler and
the real node's kubelet and kube-proxy. The CA also signs the real node's
kubelet serving certificate and the client certificate the API server shows
the kubelet (for logs, exec and port-forward). A second CA, the front proxy's,
signs only the client certificate the API server shows the extension API
servers it proxies to (the aggregation layer: prometheus-adapter's custom
metrics API), which trust the user it names in X-Remote-User because that CA
signed it.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import secrets
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import NameOID

# The real node's name and address: the gateway of its Pod bridge, an address
# that exists only on this machine (never a routable one).
NODE_NAME = "kubeloop-real"
NODE_IP = "10.244.128.1"

# Static identities (user, groups). The controller manager, the scheduler, the
# kubelet and kube-proxy get exactly the identities Kubernetes' bootstrap RBAC
# policy (and the Node authorizer) grant their permissions to.
IDENTITIES = {
    "admin": ("kubeloop-admin", "system:masters"),
    "controller-manager": ("system:kube-controller-manager", ""),
    "scheduler": ("system:kube-scheduler", ""),
    "kwok": ("kubeloop-kwok", "system:masters"),
    "node": (f"system:node:{NODE_NAME}", "system:nodes"),
    "kube-proxy": ("system:kube-proxy", ""),
    "coredns": ("kubeloop:coredns", ""),
    "prometheus": ("kubeloop:prometheus", ""),
    "metrics-adapter": ("kubeloop:prometheus-adapter", ""),
}
# The name in the front proxy's client certificate, the only one extension
# API servers accept X-Remote-* headers from.
FRONT_PROXY_CLIENT = "front-proxy-client"


@dataclass(frozen=True)
class Pki:
    """Paths of the generated material."""

    dir: Path

    @property
    def ca_cert(self) -> Path:
        return self.dir / "ca.crt"

    @property
    def serving_cert(self) -> Path:
        return self.dir / "apiserver.crt"

    @property
    def serving_key(self) -> Path:
        return self.dir / "apiserver.key"

    @property
    def service_account_key(self) -> Path:
        return self.dir / "sa.key"

    @property
    def token_file(self) -> Path:
        return self.dir / "tokens.csv"

    @property
    def kubelet_client_cert(self) -> Path:
        return self.dir / "apiserver-kubelet-client.crt"

    @property
    def kubelet_client_key(self) -> Path:
        return self.dir / "apiserver-kubelet-client.key"

    @property
    def kubelet_cert(self) -> Path:
        return self.dir / "kubelet.crt"

    @property
    def kubelet_key(self) -> Path:
        return self.dir / "kubelet.key"

    @property
    def front_proxy_ca(self) -> Path:
        return self.dir / "front-proxy-ca.crt"

    @property
    def front_proxy_client_cert(self) -> Path:
        return self.dir / "front-proxy-client.crt"

    @property
    def front_proxy_client_key(self) -> Path:
        return self.dir / "front-proxy-client.key"

    def token(self, identity: str) -> str:
        for line in self.token_file.read_text().splitlines():
            token, user, _uid, *_ = line.split(",")
            if user == IDENTITIES[identity][0]:
                return token
        raise KeyError(identity)


def create_pki(directory: Path) -> Pki:
    """Generate a CA, the API server's certificate, the SA key and tokens."""
    directory.mkdir(parents=True, exist_ok=True)
    pki = Pki(directory)
    ca_key = _rsa_key()
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kubeloop-dev-ca")])
    ca = (
        _builder(ca_name, ca_name, ca_key.public_key())
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                     content_commitment=False, key_encipherment=False,
                                     data_encipherment=False, key_agreement=False,
                                     encipher_only=False, decipher_only=False), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    names = [x509.DNSName(n) for n in ("localhost", "kubernetes", "kubernetes.default",
                                       "kubernetes.default.svc")]
    names += [x509.IPAddress(ipaddress.ip_address(a)) for a in ("127.0.0.1", "10.96.0.1", NODE_IP)]
    issue = _Issuer(ca_name, ca_key)
    pki.ca_cert.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    issue(pki.serving_cert, pki.serving_key, x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kube-apiserver")]),
          x509.oid.ExtendedKeyUsageOID.SERVER_AUTH, names)
    issue(pki.kubelet_cert, pki.kubelet_key, x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, NODE_NAME)]),
          x509.oid.ExtendedKeyUsageOID.SERVER_AUTH, [x509.IPAddress(ipaddress.ip_address(NODE_IP))])
    issue(pki.kubelet_client_cert, pki.kubelet_client_key, x509.Name([
        x509.NameAttribute(NameOID.ORGANIZATION_NAME, "system:masters"),
        x509.NameAttribute(NameOID.COMMON_NAME, "kube-apiserver-kubelet-client")]),
          x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH, [])
    create_front_proxy(pki)
    _write_key(pki.service_account_key, _rsa_key())
    rows = [f"{secrets.token_urlsafe(32)},{user},{user}" + (f',"{group}"' if group else "")
            for user, group in IDENTITIES.values()]
    pki.token_file.write_text("\n".join(rows) + "\n")
    pki.token_file.chmod(0o600)
    return pki


def create_front_proxy(pki: Pki) -> None:
    """The aggregation layer's CA (not the cluster CA: a client certificate
    the cluster CA signs must not be able to claim any user in a header) and
    the client certificate the API server proxies with."""
    key = _rsa_key()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kubeloop-front-proxy-ca")])
    ca = (_builder(name, name, key.public_key())
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .sign(key, hashes.SHA256()))
    pki.front_proxy_ca.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    _Issuer(name, key)(pki.front_proxy_client_cert, pki.front_proxy_client_key,
                       x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, FRONT_PROXY_CLIENT)]),
                       x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH, [])


def front_proxy_flags(pki: Pki) -> list[str]:
    """kube-apiserver's aggregation-layer flags: the client certificate it
    shows extension API servers, and what they check it against (published
    in kube-system's extension-apiserver-authentication ConfigMap)."""
    return [
        f"--requestheader-client-ca-file={pki.front_proxy_ca}",
        f"--requestheader-allowed-names={FRONT_PROXY_CLIENT}",
        "--requestheader-username-headers=X-Remote-User",
        "--requestheader-group-headers=X-Remote-Group",
        "--requestheader-extra-headers-prefix=X-Remote-Extra-",
        f"--proxy-client-cert-file={pki.front_proxy_client_cert}",
        f"--proxy-client-key-file={pki.front_proxy_client_key}",
    ]


@dataclass(frozen=True)
class _Issuer:
    """Issues certificates signed by the CA."""

    ca_name: x509.Name
    ca_key: rsa.RSAPrivateKey

    def __call__(self, cert_path: Path, key_path: Path, subject: x509.Name, usage: x509.ObjectIdentifier,
                 names: list[x509.GeneralName]) -> None:
        key = _rsa_key()
        builder = (_builder(subject, self.ca_name, key.public_key())
                   .add_extension(x509.ExtendedKeyUsage([usage]), critical=False))
        if names:
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        cert_path.write_bytes(builder.sign(self.ca_key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM))
        _write_key(key_path, key)


def webhook_certificates(directory: Path, dns_names: list[str]) -> tuple[bytes, bytes, bytes]:
    """A CA of its own and a serving certificate for an admission webhook's
    Service names: (CA, certificate, key) as PEM, the CA for the webhook
    configuration's caBundle. Kept in directory, so a second install reuses them."""
    paths = [directory / name for name in ("ca.crt", "tls.crt", "tls.key")]
    if not all(p.exists() for p in paths):
        directory.mkdir(parents=True, exist_ok=True)
        ca_key = _rsa_key()
        ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kubeloop-webhook-ca")])
        ca = (_builder(ca_name, ca_name, ca_key.public_key())
              .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
              .sign(ca_key, hashes.SHA256()))
        paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
        _Issuer(ca_name, ca_key)(paths[1], paths[2], x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, dns_names[0])]),
                                 x509.oid.ExtendedKeyUsageOID.SERVER_AUTH, [x509.DNSName(n) for n in dns_names])
    ca_pem, cert, key = (p.read_bytes() for p in paths)
    return ca_pem, cert, key


def _rsa_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def _builder(subject: x509.Name, issuer: x509.Name, public_key) -> x509.CertificateBuilder:  # noqa: ANN001
    now = dt.datetime.now(dt.timezone.utc)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=365))
    )


def _write_key(path: Path, key: rsa.RSAPrivateKey) -> None:
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                       serialization.PrivateFormat.TraditionalOpenSSL,
                                       serialization.NoEncryption()))
    path.chmod(0o600)
