"""A local Python base image for the Dockerfile, made from Debian packages (no image registry).

mmdebstrap makes a minimal Debian (bookworm: its essential packages and apt) with python3.11 and
its venv module, as a tarball in the per-user cache (${XDG_CACHE_HOME:-~/.cache}/kinspect/
container), keyed by the recipe (tool, variant, suite, packages, mirror), and imported once into
podman's storage as localhost/kinspect-test-base:<key>. Later runs reuse the image, or the
tarball if the image is gone. Making the tarball needs root.

mmdebstrap rather than debootstrap, for a machine's first run (CI's every run): on the 2-core
test machine, debootstrap --variant=minbase and a tar of its tree took 65 s of CPU and 55 s;
mmdebstrap --variant=apt, which installs with apt and writes the tarball itself, 35 s of CPU and
35 s. The base is 170 MB (debootstrap's was 176 MB).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

SUITE = "bookworm"  # Debian 12: python3.11, the Python kinspect targets
VARIANT = "apt"  # the essential packages and apt: what the Dockerfile's apt-get needs, and no more
# python3-distutils is named for the virtual python3.11-distutils that python3.11-venv depends on;
# passwd for the Dockerfile's groupadd and useradd (the apt variant has only essential packages).
PACKAGES = ("python3.11", "python3.11-venv", "python3-distutils", "passwd")
# /usr merged by mmdebstrap's own hook: otherwise apt installs the usrmerge package, which brings
# perl (another 50 MB in the base and the image).
MERGED_USR_HOOK = "/usr/share/mmdebstrap/hooks/merged-usr"
MIRROR = os.environ.get("KINSPECT_DEBIAN_MIRROR", "http://deb.debian.org/debian")
KEY = hashlib.sha256(f"mmdebstrap {VARIANT} merged-usr {SUITE} {' '.join(sorted(PACKAGES))} {MIRROR}".encode()).hexdigest()[:12]
BASE_IMAGE = f"localhost/kinspect-test-base:{SUITE}-{KEY}"


class BaseImageError(RuntimeError):
    """The base image could not be made (the message says which command failed and how)."""


def cache_dir() -> Path:
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    path = root / "kinspect" / "container"
    path.mkdir(parents=True, exist_ok=True)
    return path


def run(argv: list[str], timeout: float, **kwargs) -> subprocess.CompletedProcess:
    r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, **kwargs)
    if r.returncode != 0:
        raise BaseImageError(f"{' '.join(argv)} exited {r.returncode}: {(r.stdout + r.stderr)[-3000:]}")
    return r


def rootfs_tarball() -> Path:
    """The cached root filesystem tarball, made with mmdebstrap when missing."""
    tarball = cache_dir() / f"debian-{SUITE}-{KEY}.tar"
    if tarball.exists():
        return tarball
    if os.geteuid() != 0:
        raise BaseImageError(f"mmdebstrap needs root to make {tarball} (run the tests as root, as CI does)")
    work = Path(tempfile.mkdtemp(prefix="rootfs-", dir=cache_dir()))  # same filesystem: atomic rename
    try:
        # mmdebstrap leaves out the downloaded packages and indexes (the Dockerfile runs apt-get
        # update itself) and writes the tarball with numeric owners.
        run(["mmdebstrap", "--quiet", f"--variant={VARIANT}", f"--hook-dir={MERGED_USR_HOOK}",
             f"--include={','.join(PACKAGES)}", SUITE, str(work / "rootfs.tar"), MIRROR], timeout=900)
        os.replace(work / "rootfs.tar", tarball)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return tarball


def base_image() -> str:
    """The base image's name, imported into podman's storage if it is not there yet."""
    if subprocess.run(["podman", "image", "exists", BASE_IMAGE], timeout=60).returncode == 0:
        return BASE_IMAGE
    run(["podman", "import", "--change", 'CMD ["python3"]', str(rootfs_tarball()), BASE_IMAGE], timeout=300)
    return BASE_IMAGE
