"""noVNC's browser files for the console's live view, read from the sandbox's own image.

The desktop image has Debian's ``novnc`` (``/usr/share/novnc``); the console serves its
``core/`` and ``vendor/`` (the RFB client and what it imports) at
``/sandboxes/ID/novnc/...``, so the host needs no noVNC of its own and nothing is vendored
in callbox. The files are read through the Docker engine from a container created from the
image and never started (not from the running sandbox, whose program could change them),
once per image id, and kept in memory (about 1 MB).
"""

from __future__ import annotations

import contextlib
import io
import mimetypes
import tarfile
import threading
from collections.abc import Callable

import docker
import docker.errors
import requests

from harness.core.errors import short_reason

__all__ = ["NOVNC_DIR", "NovncError", "NovncFiles"]

NOVNC_DIR = "/usr/share/novnc"
SERVED = ("core/", "vendor/")
"""The parts of noVNC the live view serves: the RFB client and its inflate library."""
FILES_MAX_BYTES = 16 << 20


class NovncError(Exception):
    """noVNC's files could not be read from the image (the message says why)."""


class NovncFiles:
    """noVNC's served files by image id (see the module docstring)."""

    def __init__(self, client: Callable[[], docker.DockerClient] = docker.from_env) -> None:
        self._client = client
        self._lock = threading.Lock()
        self._by_image: dict[str, dict[str, bytes]] = {}

    def file(self, image: str, path: str) -> tuple[bytes, str] | None:
        """The content and media type of ``path`` (``core/rfb.js``) in ``image``'s noVNC;
        None when noVNC has no such served file. NovncError when the image cannot be read."""
        files = self._files(image)
        data = files.get(path)
        if data is None:
            return None
        kind = "text/javascript" if path.endswith(".js") else mimetypes.guess_type(path)[0] or "text/plain"
        return data, kind

    def _files(self, image: str) -> dict[str, bytes]:
        with self._lock:
            found = self._by_image.get(image)
        if found is not None:
            return found
        files = self._read(image)
        with self._lock:
            self._by_image[image] = files
        return files

    def _read(self, image: str) -> dict[str, bytes]:
        try:
            client = self._client()
        except docker.errors.DockerException as error:
            raise NovncError(f"the Docker engine does not answer ({short_reason(error)})") from None
        container = None
        try:
            container = client.containers.create(image, entrypoint=["/bin/true"], network_disabled=True,
                                                  labels={"callbox.role": "novnc-files"})
            stream, _ = container.get_archive(NOVNC_DIR)
            archive = b"".join(stream)
        except docker.errors.NotFound:
            raise NovncError(f"the image {image} has no {NOVNC_DIR}: it is not the desktop image "
                             "(`callbox image build --variant desktop`)") from None
        except (docker.errors.DockerException, requests.exceptions.RequestException) as error:
            raise NovncError(f"noVNC's files could not be read from the image {image}: {short_reason(error)}"
                             ) from None
        finally:
            if container is not None:
                with contextlib.suppress(docker.errors.DockerException):
                    container.remove(force=True)
            client.close()
        return _served(archive)


def _served(archive: bytes) -> dict[str, bytes]:
    """The served files of noVNC's directory archive, by path under it."""
    files: dict[str, bytes] = {}
    total = 0
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        for member in tar:
            if not member.isfile():
                continue
            path = member.name.partition("/")[2]  # the archive's first part is "novnc"
            if not path.startswith(SERVED) or ".." in path.split("/"):
                continue
            handle = tar.extractfile(member)
            if handle is None:
                continue
            data = handle.read()
            total += len(data)
            if total > FILES_MAX_BYTES:
                raise NovncError(f"noVNC's files are over {FILES_MAX_BYTES} bytes: not the noVNC of Debian's package")
            files[path] = data
    if "core/rfb.js" not in files:
        raise NovncError(f"{NOVNC_DIR} in the image has no core/rfb.js: not the noVNC of Debian's package")
    return files
