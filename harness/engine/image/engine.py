"""Docker helpers of the image builder: image lookups, tag validation and tagging, readable engine errors."""

from __future__ import annotations

import re

import docker
import docker.errors

from harness.engine.image.common import DEFAULT_TAG, LABEL_HASH
from harness.engine.image.errors import ImageBuildError


def find_image(client: docker.DockerClient, tag: str = DEFAULT_TAG) -> str | None:
    """The id of the local image ``tag``, or None when there is none."""
    try:
        image = client.images.get(tag)
    except docker.errors.ImageNotFound:
        return None
    except docker.errors.APIError as exc:
        # 20.10 answers an invalid reference with 400 rather than 404.
        if exc.status_code == 400:
            return None
        raise
    return str(image.id)


def image_with_hash(client: docker.DockerClient, digest: str, hash_tag: str) -> str | None:
    """The image a build of ``digest`` made, found by the tag that build gave it (``hash_tag``,
    ``REPO:DIGEST12``) and checked by its label. Never any other image with that label: an image
    built ``FROM`` callbox's inherits its labels (a user's own, a template, a failed build's
    layer), and taking it would tag someone else's image as callbox's."""
    try:
        image = client.images.get(hash_tag)
    except docker.errors.ImageNotFound:
        return None
    return str(image.id) if (image.labels or {}).get(LABEL_HASH) == digest else None


def hash_tag_of(tag: str, digest: str) -> str:
    """The tag a build of ``digest`` gives its image beside ``tag``: ``tag``'s repository, the
    digest's first 12 hex digits as the tag."""
    return f"{split_tag(tag)[0]}:{digest[:12]}"


_NAME_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_DOMAIN_COMPONENT = r"[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?"
_DOMAIN = rf"(?:{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*(?::[0-9]+)?/)"
_REFERENCE = re.compile(rf"({_DOMAIN}?{_NAME_COMPONENT}(?:/{_NAME_COMPONENT})*)(?::([\w][\w.-]{{0,127}}))?")


def split_tag(tag: str) -> tuple[str, str]:
    """``repo[:tag]`` -> (repo, tag), validated like Docker does (lowercase name, no digest)."""
    match = _REFERENCE.fullmatch(tag)
    if match is None or len(match.group(1)) > 255:
        raise ImageBuildError(f"invalid image tag {tag!r}: use NAME[:TAG] with a lowercase name (e.g. {DEFAULT_TAG})")
    return match.group(1), match.group(2) or "latest"


def docker_error(exc: Exception) -> str:
    text = getattr(exc, "explanation", None) or str(exc)
    return str(text).strip().splitlines()[-1] if str(text).strip() else type(exc).__name__


def ping(client: docker.DockerClient) -> None:
    try:
        client.ping()
    except Exception as exc:  # requests/urllib3 raise various types for an unreachable socket
        raise ImageBuildError(
            f"the Docker engine is unreachable ({docker_error(exc)}); start dockerd or set DOCKER_HOST"
        ) from None


def tag_image(client: docker.DockerClient, image_id: str, tags: list[str]) -> None:
    for full in tags:
        repo, name = split_tag(full)
        try:
            ok = client.api.tag(image_id, repo, name, force=True)
        except docker.errors.APIError as exc:
            raise ImageBuildError(f"could not tag {image_id[7:19]} as {full}: {docker_error(exc)}") from None
        if not ok:
            raise ImageBuildError(f"the Docker engine refused to tag {image_id[:19]} as {full}")
