"""A template store of one test or benchmark's own, and the images its builds made removed after."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import docker

TEMPLATE_DIR_VARIABLE = "CALLBOX_TEMPLATE_DIR"


@contextlib.contextmanager
def template_store(client: docker.DockerClient, prefix: str = "cbx-tpl-") -> Iterator[Path]:
    """``CALLBOX_TEMPLATE_DIR`` set to a new directory for the block (servers started in it
    keep their templates there); at the end the variable is restored, every image built
    into that store's cache is removed, and the directory with it."""
    directory = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    saved = os.environ.get(TEMPLATE_DIR_VARIABLE)
    os.environ[TEMPLATE_DIR_VARIABLE] = str(directory)
    try:
        yield directory
    finally:
        if saved is None:
            os.environ.pop(TEMPLATE_DIR_VARIABLE, None)
        else:
            os.environ[TEMPLATE_DIR_VARIABLE] = saved
        for entry in (directory / "cache").glob("*"):
            if len(entry.name) == 64:  # a cache key (the SHA-256 of a template's steps)
                for image in client.images.list(filters={"label": f"callbox.template.key={entry.name}"}):
                    with contextlib.suppress(docker.errors.DockerException):
                        client.images.remove(image.id, force=True)
        shutil.rmtree(directory, ignore_errors=True)
