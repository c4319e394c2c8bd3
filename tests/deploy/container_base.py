"""A local Python base image for the Dockerfile, made from Debian packages (no image registry).

debootstrap makes a minimal Debian (bookworm) with python3.11 and its venv module; the root
filesystem is kept as a tarball in the per-user cache (${XDG_CACHE_HOME:-~/.cache}/kinspect/
container), keyed by suite, packages and mirror, and imported once into podman's storage as
localhost/kinspect-test-base:<key>. Later runs reuse the image, or the tarball if the image is
gone. debootstrap needs root.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

SUITE = "bookworm"  # Debian 12: python3.11, the Python kinspect targets
# python3-distutils is named because debootstrap's --include does not resolve the virtual
# python3.11-distutils that python3.11-venv depends on.
PACKAGES = ("python3.11", "python3.11-venv", "python3-distutils")
MIRROR = os.environ.get("KINSPECT_DEBIAN_MIRROR", "http://deb.debian.org/debian")
KEY = hashlib.sha256(f"{SUITE} {' '.join(sorted(PACKAGES))} {MIRROR}".encode()).hexdigest()[:12]
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
    """The cached root filesystem tarball, made with debootstrap when missing."""
    tarball = cache_dir() / f"debian-{SUITE}-{KEY}.tar"
    if tarball.exists():
        return tarball
    if os.geteuid() != 0:
        raise BaseImageError(f"debootstrap needs root to make {tarball} (run the tests as root, as CI does)")
    work = Path(tempfile.mkdtemp(prefix="rootfs-", dir=cache_dir()))  # same filesystem: atomic rename
    try:
        rootfs = work / "rootfs"
        run(["debootstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}", SUITE, str(rootfs), MIRROR],
            timeout=900)
        # Downloaded packages and indexes: the Dockerfile runs apt-get update itself.
        for leftover in ("var/cache/apt/archives", "var/lib/apt/lists"):
            for entry in (rootfs / leftover).glob("*"):
                if entry.is_file():
                    entry.unlink()
        run(["tar", "-C", str(rootfs), "--numeric-owner", "-cf", str(work / "rootfs.tar"), "."], timeout=300)
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
