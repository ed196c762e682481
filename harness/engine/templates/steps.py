"""A template's recipe: its base, its steps, its start and ready commands; their hash and Dockerfile.

A recipe is what the e2b SDK's ``Template`` sends to ``POST /v2/templates/{id}/builds/{build}``
(``fromImage`` or ``fromTemplate``, ``steps`` of type ``RUN``, ``COPY``, ``ENV``, ``WORKDIR``,
``USER``, ``startCmd``, ``readyCmd``, ``force``), and what ``callbox template build`` makes of
its flags. :func:`parse_recipe` checks it whole before anything is built: an unknown step
type, a missing argument or a registry login is refused with the step named, never skipped.

The image is built by Docker's own builder from the Dockerfile :func:`dockerfile` writes:

* ``RUN`` is ``RUN ["/bin/sh", "-c", CMD]`` (the exec form: nothing of the command is parsed
  by Docker); a step with its own user is wrapped in ``USER`` lines.
* ``COPY SRC DEST [USER [MODE]]`` copies the files uploaded under the step's ``filesHash``
  (they sit in the build context under ``step-N/``); the mode is set in the context, the
  owner with ``--chown``.
* ``ENV K V ...``, ``WORKDIR DIR`` as in a Dockerfile.
* ``USER NAME`` for the steps after it. callbox runs every sandbox command as its one
  unprivileged user, so a user only matters while building: E2B's default user ``user``
  (which callbox's images do not have) builds as ``root``.

The recipe's cache key (:meth:`Recipe.cache_key`) is a SHA-256 over the base (the local
image's id, or the parent template's key), every step with its arguments and files hash, and
:data:`RECIPE_FORMAT`; start and ready commands are not in it (they are kept beside the
image, not built into it). Two builds with the same key make the same image, so the second
one is found in the cache and takes no build at all.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from harness.core.errors import CallboxError, ErrorCode

__all__ = ["BUILD_USERS", "RECIPE_FORMAT", "STEP_TYPES", "Recipe", "Step", "checked", "dockerfile",
           "dockerfile_lines", "parse_recipe", "step_dir"]

RECIPE_FORMAT = 1
"""Bump when the Dockerfile of the same recipe changes: every cached image is then rebuilt."""
STEP_TYPES = ("RUN", "COPY", "ENV", "WORKDIR", "USER")
BUILD_USERS = {"user": "root", "root": "root"}
"""Build-time users by the names E2B templates use: ``user`` is E2B's default user."""
_FILES_HASH = re.compile(r"[0-9a-f]{64}")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_USER = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*(:[A-Za-z0-9_][A-Za-z0-9_.-]*)?")


def _refuse(message: str) -> CallboxError:
    return CallboxError(message, code=ErrorCode.INVALID_REQUEST)


@dataclass(frozen=True)
class Step:
    """One step of a recipe, as the SDK sends it."""

    type: str
    args: tuple[str, ...]
    files_hash: str | None = None
    """COPY only: the SHA-256 the SDK computed over the files, under which they were uploaded."""
    force: bool = False
    """Build this step (and every one after it) again even if cached."""

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": self.type, "args": list(self.args), "force": self.force}
        if self.files_hash is not None:
            out["filesHash"] = self.files_hash
        return out


@dataclass(frozen=True)
class Recipe:
    """What a template is built from; see the module docstring."""

    from_image: str | None = None
    from_template: str | None = None
    steps: tuple[Step, ...] = ()
    start_cmd: str | None = None
    ready_cmd: str | None = None
    force: bool = False
    """Build everything again, ignoring the cache (the SDK's ``skip_cache``)."""

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"steps": [step.to_json() for step in self.steps], "force": self.force}
        for key, value in (("fromImage", self.from_image), ("fromTemplate", self.from_template),
                           ("startCmd", self.start_cmd), ("readyCmd", self.ready_cmd)):
            if value is not None:
                out[key] = value
        return out

    @property
    def files_hashes(self) -> list[str]:
        """The files hashes of the COPY steps, in order (each uploaded before the build)."""
        return [step.files_hash for step in self.steps if step.files_hash is not None]

    @property
    def forced(self) -> bool:
        return self.force or any(step.force for step in self.steps)

    def cache_key(self, base: str) -> str:
        """The hash the built image is cached under; ``base`` is the resolved base: the local
        image's id (``sha256:...``) or the parent template's cache key."""
        material = json.dumps({"format": RECIPE_FORMAT, "base": base,
                               "steps": [[s.type, list(s.args), s.files_hash] for s in self.steps]},
                              sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(material.encode()).hexdigest()

    def workdir(self) -> str | None:
        """The working directory the last ``WORKDIR`` step leaves (None: none sets one)."""
        found = None
        for step in self.steps:
            if step.type == "WORKDIR":
                found = posixpath.join(found or "/", step.args[0])
        return posixpath.normpath(found) if found is not None else None

    def env_names(self) -> list[str]:
        """The names the ``ENV`` steps set, in order, each once."""
        names: list[str] = []
        for step in self.steps:
            if step.type == "ENV":
                names += [name for name in step.args[0::2] if name not in names]
        return names


def _text(value: object, what: str) -> str:
    if not isinstance(value, str):
        raise _refuse(f"{what} must be a string, not {type(value).__name__}")
    if "\0" in value:
        raise _refuse(f"{what} contains a NUL byte")
    return value


def _optional_text(body: Mapping[str, Any], key: str) -> str | None:
    value = body.get(key)
    if value is None:
        return None
    text = _text(value, key)
    return text if text.strip() else None


def _step(index: int, raw: object) -> Step:
    where = f"steps[{index}]"
    if not isinstance(raw, Mapping):
        raise _refuse(f"{where} must be an object with type and args")
    kind = raw.get("type")
    if kind not in STEP_TYPES:
        raise _refuse(f"{where}: step type {kind!r} is not supported by this server; it builds "
                      f"{', '.join(STEP_TYPES)}")
    args_raw = raw.get("args") or []
    if not isinstance(args_raw, list):
        raise _refuse(f"{where}.args must be a list of strings")
    args = tuple(_text(arg, f"{where}.args[{n}]") for n, arg in enumerate(args_raw))
    files_hash = raw.get("filesHash")
    if kind == "RUN":
        if not args or not args[0].strip():
            raise _refuse(f"{where}: RUN needs a command")
        if len(args) > 1 and args[1] and not _USER.fullmatch(args[1]):
            raise _refuse(f"{where}: RUN user {args[1]!r} is not a user name")
    elif kind == "COPY":
        if len(args) < 2 or not args[0] or not args[1]:
            raise _refuse(f"{where}: COPY needs a source and a destination")
        src = posixpath.normpath(args[0])
        if src.startswith("/") or src == ".." or src.startswith("../"):
            raise _refuse(f"{where}: COPY source {args[0]!r} must be a path inside the template's directory")
        if not isinstance(files_hash, str) or not _FILES_HASH.fullmatch(files_hash):
            raise _refuse(f"{where}: COPY needs the filesHash of its uploaded files (64 hex digits)")
        if len(args) > 2 and args[2] and not _USER.fullmatch(args[2]):
            raise _refuse(f"{where}: COPY owner {args[2]!r} is not user[:group]")
        if len(args) > 3 and args[3] and not re.fullmatch(r"0?[0-7]{3,4}", args[3]):
            raise _refuse(f"{where}: COPY mode {args[3]!r} is not an octal mode like 0755")
    elif kind == "ENV":
        if not args or len(args) % 2:
            raise _refuse(f"{where}: ENV needs name, value pairs")
        for name in args[0::2]:
            if not _ENV_NAME.fullmatch(name):
                raise _refuse(f"{where}: {name!r} is not an environment variable name")
    elif kind == "WORKDIR":
        if len(args) != 1 or not args[0]:
            raise _refuse(f"{where}: WORKDIR needs one directory")
    elif kind == "USER" and (len(args) != 1 or not _USER.fullmatch(args[0])):
        raise _refuse(f"{where}: USER needs one user name")
    if kind != "COPY":
        files_hash = None
    return Step(type=str(kind), args=args, files_hash=files_hash, force=bool(raw.get("force")))


def parse_recipe(body: object) -> Recipe:
    """The recipe of a build request body (the SDK's ``TemplateBuildStartV2``), checked whole."""
    if not isinstance(body, Mapping):
        raise _refuse("the build request body must be a JSON object with steps")
    if body.get("fromImageRegistry"):
        raise CallboxError("fromImageRegistry: this server pulls from no registry and keeps no registry "
                           "credentials; build from an image on this host (the operator loads it with "
                           "`docker load` or `docker pull`)", code=ErrorCode.NOT_SUPPORTED)
    from_image = _optional_text(body, "fromImage")
    from_template = _optional_text(body, "fromTemplate")
    if from_template is not None:
        from_image = None  # the SDK sends one of them; a template wins as in E2B
    if from_image is None and from_template is None:
        raise _refuse("a template needs fromImage or fromTemplate")
    steps_raw = body.get("steps") or []
    if not isinstance(steps_raw, list):
        raise _refuse("steps must be a list")
    steps = tuple(_step(index, raw) for index, raw in enumerate(steps_raw))
    return Recipe(from_image=from_image, from_template=from_template, steps=steps,
                  start_cmd=_optional_text(body, "startCmd"), ready_cmd=_optional_text(body, "readyCmd"),
                  force=bool(body.get("force")))


def step_dir(index: int) -> str:
    """Where the files of COPY step ``index`` sit in the build context."""
    return f"step-{index}"


def _quoted_env(value: str) -> str:
    return json.dumps(value)  # Docker's ENV takes a double-quoted value with backslash escapes


def _build_user(name: str) -> str:
    user, _, group = name.partition(":")
    user = BUILD_USERS.get(user, user)
    return f"{user}:{group}" if group else user


@dataclass
class _Writer:
    lines: list[tuple[str, str]] = field(default_factory=list)
    user: str = "root"
    step: str = "base"

    def add(self, line: str) -> None:
        self.lines.append((line, self.step))


def dockerfile(recipe: Recipe, base: str, labels: Mapping[str, str] | None = None,
               base_labels: Mapping[str, str] | None = None) -> str:
    """The Dockerfile of ``recipe`` built on the local image ``base`` (its id or name)."""
    return "\n".join(line for line, _ in dockerfile_lines(recipe, base, labels, base_labels)) + "\n"


def dockerfile_lines(recipe: Recipe, base: str, labels: Mapping[str, str] | None = None,
                     base_labels: Mapping[str, str] | None = None) -> list[tuple[str, str]]:
    """The Dockerfile's instructions, one a line, each with the recipe step it comes from
    (``base``, the step's index, ``finalize``): Docker's ``Step N/M`` is line N. ``labels``
    go on the last image; ``base_labels`` replace the base's on every image of the build, the
    intermediate ones (left behind by a failed build) included."""
    out = _Writer()
    out.add(f"FROM {base}")
    for key, value in sorted((base_labels or {}).items()):
        out.add(f"LABEL {json.dumps(key)}={json.dumps(value)}")
    out.add("USER root")
    for index, step in enumerate(recipe.steps):
        out.step = str(index)
        if step.type == "RUN":
            run = f"RUN {json.dumps(['/bin/sh', '-c', step.args[0]])}"
            own = step.args[1] if len(step.args) > 1 and step.args[1] else None
            if own is not None and _build_user(own) != out.user:
                out.add(f"USER {_build_user(own)}")
                out.add(run)
                out.add(f"USER {out.user}")
            else:
                out.add(run)
        elif step.type == "COPY":
            owner = step.args[2] if len(step.args) > 2 and step.args[2] else None
            chown = f"--chown={_build_user(owner)} " if owner else ""
            src = posixpath.normpath(step.args[0])
            dest = step.args[1]
            out.add(f"COPY {chown}{json.dumps([f'{step_dir(index)}/{src}', dest])}")
        elif step.type == "ENV":
            pairs = " ".join(f"{name}={_quoted_env(value)}" for name, value in zip(step.args[0::2],
                                                                                   step.args[1::2], strict=True))
            out.add(f"ENV {pairs}")
        elif step.type == "WORKDIR":
            out.add(f"WORKDIR {json.dumps(step.args[0])[1:-1]}")
        elif step.type == "USER":
            out.user = _build_user(step.args[0])
            out.add(f"USER {out.user}")
    out.step = "finalize"
    out.add("USER root")
    for key, value in sorted((labels or {}).items()):
        out.add(f"LABEL {json.dumps(key)}={json.dumps(value)}")
    return out.lines


def checked(recipe: Recipe) -> Recipe:
    """``recipe`` (made by a program rather than sent by a client) checked as a sent one is."""
    return parse_recipe(recipe.to_json())
