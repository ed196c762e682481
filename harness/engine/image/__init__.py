"""Build the sandbox image offline and idempotently (``callbox image build``).

Two layers, no registry needed:

1. **Base** (skipped with ``base=IMAGE``): a Debian root filesystem made with
   ``debootstrap --variant=minbase --include=...`` for the host's suite (VERSION_CODENAME from
   /etc/os-release on a Debian host, otherwise ``bookworm``), from the first mirror in the machine's own
   apt sources that serves that suite (or debootstrap's default; no mirror host is written here), loaded
   with ``docker import`` as ``callbox-base:<suite>-<hash12>``. The tag is content-addressed over the
   suite, package list and architecture, so it is reused as long as it exists.
2. **Agent layer**: ``images/Dockerfile`` (classic builder, works on Docker 20.10) on top of the base:
   user ``user`` (1000:1000; ``sandbox`` a second name of it), ``/workspace``, the agent's Python
   dependencies (the exact grpcio, protobuf and psutil versions installed on the host, so generated
   gRPC code matches) installed from a
   host-side wheelhouse into ``/opt/callbox/lib``, the ``sandbox/`` package next to them, and
   ``ENTRYPOINT ["/usr/bin/python3", "-I", "-S", "/opt/callbox/agent.py"]``.

Idempotence: a content hash over (base image id, Dockerfile text, ``sandbox/`` sources, dependency
versions, wheel file names, :data:`IMAGE_FORMAT_VERSION`) is stored as the label ``callbox.image.hash``;
when an image with that label exists it is only (re)tagged. The wheelhouse for a given
(Python, platform, pins) lives in its own cache directory with a manifest, so a rerun skips pip.

Everything here is library code: the CLI wires it to ``callbox image build [--base IMAGE] [--tag TAG]``.
User-facing failures raise :class:`ImageBuildError` with a readable message.

This package exports the public API only; one job per module: ``sources`` (os-release, apt sources,
mirror, suite), ``engine`` (Docker lookups and tagging), ``probe`` (the base's Python and glibc),
``base`` (debootstrap and import of the base), ``wheels`` (pins, platforms, pip download, cache),
``context`` (build context and ``docker build``), ``build`` (content hash, lock, :func:`build_image`),
``common`` (shared tags, labels and format version) and ``errors``.
"""

from __future__ import annotations

from harness.engine.image.build import ImageBuildResult, build_image, default_repo_root
from harness.engine.image.common import DEFAULT_TAG, IMAGE_FORMAT_VERSION
from harness.engine.image.engine import find_image
from harness.engine.image.errors import ImageBuildError

__all__ = [
    "DEFAULT_TAG",
    "IMAGE_FORMAT_VERSION",
    "ImageBuildError",
    "ImageBuildResult",
    "build_image",
    "default_repo_root",
    "find_image",
]
