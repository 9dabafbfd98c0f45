"""Test certificates made with `openssl` (a CA, certificates it signs), and Kubernetes'
way of updating the files of a mounted Secret (`publish_version`)."""

import subprocess
from pathlib import Path


def make_ca(directory: Path, name: str = "ca") -> tuple[Path, Path]:
    """A self-signed CA: (certificate, key)."""
    ca = directory / f"{name}.pem", directory / f"{name}.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", f"/CN=test {name}", "-keyout", str(ca[1]), "-out", str(ca[0])],
                   check=True, capture_output=True)
    return ca


def sign(directory: Path, ca: tuple[Path, Path], name: str, subject: str,
         extension: str = "") -> tuple[Path, Path]:
    """A key and a certificate for `subject`, signed by the CA `ca`."""
    key, request, cert = (directory / f"{name}.key", directory / f"{name}.csr",
                          directory / f"{name}.pem")
    subprocess.run(["openssl", "req", "-newkey", "rsa:2048", "-nodes", "-subj", subject,
                    "-keyout", str(key), "-out", str(request)], check=True, capture_output=True)
    extra = directory / f"{name}.ext"
    extra.write_text(extension)
    subprocess.run(["openssl", "x509", "-req", "-in", str(request), "-CA", str(ca[0]),
                    "-CAkey", str(ca[1]), "-CAcreateserial", "-days", "1", "-out", str(cert),
                    "-extfile", str(extra)], check=True, capture_output=True)
    return cert, key


def server_certificate(directory: Path, ca: tuple[Path, Path],
                       name: str = "server") -> tuple[Path, Path]:
    return sign(directory, ca, name, "/CN=127.0.0.1", "subjectAltName=IP:127.0.0.1\n")


def publish_version(mounted: Path, version: str, files: dict[str, Path]) -> None:
    """What kubelet does to a mounted Secret: the files (name -> source) in a new directory,
    then the `..data` symlink swapped to it in one rename; the first version also makes each
    name a link through `..data`."""
    (mounted / version).mkdir()
    for name, source in files.items():
        (mounted / version / name).write_bytes(source.read_bytes())
    (mounted / "..data_tmp").symlink_to(version)
    (mounted / "..data_tmp").replace(mounted / "..data")
    for name in files:
        if not (mounted / name).is_symlink():
            (mounted / name).symlink_to(f"..data/{name}")
