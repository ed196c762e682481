"""Pure logic of the image builder (harness/engine/image/) and the shipped seccomp profile: no Docker."""

from __future__ import annotations

import importlib.metadata
import io
import json
import re
import tarfile
from importlib import resources
from pathlib import Path

import pytest

from harness.engine.image import ImageBuildError, base, build, context, probe, wheels
from harness.engine.image.base import base_tag
from harness.engine.image.build import content_hash, sandbox_sources
from harness.engine.image.engine import split_tag
from harness.engine.image.probe import parse_probe
from harness.engine.image.sources import (
    AptSource,
    apt_sources,
    find_mirror,
    host_suite,
    parse_deb822_sources,
    parse_one_line_sources,
    parse_os_release,
)
from harness.engine.image.wheels import manylinux_platforms, pip_download_command, requirements_text

REPO = Path(__file__).resolve().parents[2]

# --- apt sources ------------------------------------------------------------------------------------


def test_one_line_sources_with_options_comments_and_deb_src():
    text = """
# a comment
deb-src http://src.example/debian bookworm main
deb [arch=amd64 signed-by=/usr/share/keyrings/x.gpg] http://mirror.example/debian bookworm main contrib
deb http://mirror.example/debian-security bookworm-security main  # trailing comment
deb cdrom:[Debian GNU/Linux 12]/ bookworm main
   deb    http://spaces.example/debian   trixie   main
deb http://broken.example
"""
    assert parse_one_line_sources(text) == [
        AptSource("http://mirror.example/debian", ("bookworm",)),
        AptSource("http://mirror.example/debian-security", ("bookworm-security",)),
        AptSource("cdrom:[Debian", ("GNU/Linux",)),
        AptSource("http://spaces.example/debian", ("trixie",)),
    ]


def test_deb822_sources_stanzas_enabled_and_continuations():
    text = """Types: deb
# http://snapshot.debian.org/archive/debian/20250520T000000Z
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb-src
URIs: http://only-source.example/debian
Suites: bookworm

types: deb deb-src
uris: http://a.example/debian
 http://b.example/debian
suites: trixie
Enabled: yes

Types: deb
URIs: http://disabled.example/debian
Suites: bookworm
Enabled: no
"""
    assert parse_deb822_sources(text) == [
        AptSource("http://deb.debian.org/debian", ("bookworm", "bookworm-updates")),
        AptSource("http://a.example/debian", ("trixie",)),
        AptSource("http://b.example/debian", ("trixie",)),
    ]


def test_deb822_signed_by_block_does_not_break_parsing():
    text = """Types: deb
URIs: http://mirror.example/debian
Suites: bookworm
Signed-By:
 -----BEGIN PGP PUBLIC KEY BLOCK-----
 .
 mQINBGQ...
 -----END PGP PUBLIC KEY BLOCK-----
Components: main
"""
    assert parse_deb822_sources(text) == [AptSource("http://mirror.example/debian", ("bookworm",))]


def test_apt_sources_reads_in_apt_order_and_ignores_other_files(tmp_path):
    (tmp_path / "sources.list").write_text("deb http://main.example/debian trixie main\n")
    d = tmp_path / "sources.list.d"
    d.mkdir()
    (d / "b.sources").write_text("Types: deb\nURIs: http://b.example/debian\nSuites: bookworm\n")
    (d / "a.list").write_text("deb https://packages.example/apt cloud-sdk-bookworm main\n")
    (d / "c.list").write_text("deb http://c.example/debian bookworm main\n")
    (d / "z.sources.disabled-by-farm").write_text("Types: deb\nURIs: http://no.example\nSuites: bookworm\n")
    (d / "y.list.save").write_text("deb http://no.example/debian bookworm main\n")
    assert [s.uri for s in apt_sources(tmp_path)] == [
        "http://main.example/debian",
        "https://packages.example/apt",
        "http://b.example/debian",
        "http://c.example/debian",
    ]
    assert find_mirror("bookworm", apt_sources(tmp_path)) == "http://b.example/debian"


def test_apt_sources_missing_directory_is_empty(tmp_path):
    assert apt_sources(tmp_path / "nope") == []


def test_find_mirror_needs_the_exact_suite_and_a_usable_scheme():
    sources = [
        AptSource("https://packages.example/apt", ("cloud-sdk-bookworm",)),
        AptSource("http://sec.example/debian-security", ("bookworm-security",)),
        AptSource("cdrom:[Debian]/", ("bookworm",)),
        AptSource("mirror+file:/etc/apt/mirrors.txt", ("bookworm",)),
        AptSource("http://deb.example/debian/", ("bookworm", "bookworm-updates")),
    ]
    assert find_mirror("bookworm", sources) == "http://deb.example/debian"
    assert find_mirror("trixie", sources) is None
    assert find_mirror("bookworm", []) is None


def test_no_mirror_host_is_written_into_the_builder():
    modules = sorted((REPO / "harness" / "engine" / "image").glob("*.py"))
    assert modules
    for module in modules:
        source = module.read_text()
        hint = "the mirror must come from apt sources or debootstrap"
        assert not re.search(r"https?://", source), f"{module.name}: {hint}"


# --- suite ------------------------------------------------------------------------------------------


def test_parse_os_release_quotes():
    info = parse_os_release('ID=debian\nVERSION_CODENAME=bookworm\nPRETTY_NAME="Debian GNU/Linux 12"\n# x\n')
    assert info == {"ID": "debian", "VERSION_CODENAME": "bookworm", "PRETTY_NAME": "Debian GNU/Linux 12"}


@pytest.mark.parametrize(
    ("content", "suite"),
    [
        ("ID=debian\nVERSION_CODENAME=trixie\n", "trixie"),
        ('ID="debian"\nVERSION_CODENAME="bookworm"\n', "bookworm"),
        ("ID=debian\n", "bookworm"),  # sid has no codename
        ("ID=ubuntu\nVERSION_CODENAME=noble\n", "bookworm"),
        ("ID=debian\nVERSION_CODENAME=../../etc\n", "bookworm"),
    ],
)
def test_host_suite(tmp_path, content, suite):
    path = tmp_path / "os-release"
    path.write_text(content)
    assert host_suite(path) == suite


def test_host_suite_without_os_release(tmp_path):
    assert host_suite(tmp_path / "missing") == "bookworm"


def test_base_tag_is_content_addressed():
    tag = base_tag("bookworm", "x86_64")
    assert re.fullmatch(r"callbox-base:bookworm-[0-9a-f]{12}", tag)
    assert base_tag("bookworm", "x86_64") == tag
    assert base_tag("trixie", "x86_64") != tag
    assert base_tag("bookworm", "aarch64") != tag
    assert base_tag("bookworm", "x86_64", (*base.BASE_PACKAGES, "jq")) != tag


def test_base_packages_cover_the_tools():
    tools = (
        "bash", "coreutils", "python3", "python3-pip", "python3-venv", "python3-dev", "build-essential", "make",
        "git", "ripgrep", "patch", "curl", "ca-certificates", "xz-utils", "file", "unzip", "procps", "less",
    )
    for pkg in tools:
        assert pkg in base.BASE_PACKAGES
    assert "passwd" in base.BASE_PACKAGES  # useradd/groupadd for the Dockerfile
    assert len(set(base.BASE_PACKAGES)) == len(base.BASE_PACKAGES)


# --- content hash -----------------------------------------------------------------------------------


def _hash(**overrides):
    args = {
        "base_id": "sha256:" + "a" * 64,
        "dockerfile": "FROM x\n",
        "sources": [("sandbox/__init__.py", b""), ("sandbox/v1/x_pb2.py", b"x = 1\n")],
        "pins": {"grpcio": "1.85.3", "protobuf": "7.36.2", "psutil": "7.2.2"},
        "wheels": ["grpcio-1.85.3-cp311-cp311-manylinux2014_x86_64.whl", "pip-26.3-py3-none-any.whl"],
    }
    args.update(overrides)
    return content_hash(**args)


def test_content_hash_is_stable_and_order_insensitive():
    h = _hash()
    assert re.fullmatch(r"[0-9a-f]{64}", h)
    assert _hash() == h
    assert _hash(sources=[("sandbox/v1/x_pb2.py", b"x = 1\n"), ("sandbox/__init__.py", b"")]) == h
    assert _hash(wheels=["pip-26.3-py3-none-any.whl", "grpcio-1.85.3-cp311-cp311-manylinux2014_x86_64.whl"]) == h
    assert _hash(pins={"psutil": "7.2.2", "protobuf": "7.36.2", "grpcio": "1.85.3"}) == h


@pytest.mark.parametrize(
    "change",
    [
        {"base_id": "sha256:" + "b" * 64},
        {"dockerfile": "FROM y\n"},
        {"sources": [("sandbox/__init__.py", b"# changed"), ("sandbox/v1/x_pb2.py", b"x = 1\n")]},
        {"sources": [("sandbox/__init__.py", b"")]},
        {"sources": [("sandbox/init.py", b""), ("sandbox/v1/x_pb2.py", b"x = 1\n")]},
        {"pins": {"grpcio": "1.85.4", "protobuf": "7.36.2", "psutil": "7.2.2"}},
        {"wheels": ["pip-26.3-py3-none-any.whl"]},
    ],
)
def test_content_hash_changes_with_every_input(change):
    assert _hash(**change) != _hash()


def test_content_hash_changes_with_the_format_version(monkeypatch):
    before = _hash()
    monkeypatch.setattr(build, "IMAGE_FORMAT_VERSION", build.IMAGE_FORMAT_VERSION + 1)
    assert _hash() != before


# --- sandbox sources --------------------------------------------------------------------------------


def test_sandbox_sources_picks_python_stubs_and_marker(tmp_path):
    pkg = tmp_path / "sandbox"
    (pkg / "v1").mkdir(parents=True)
    (pkg / "__pycache__").mkdir()
    (pkg / ".hidden").mkdir()
    for rel in ("__init__.py", "py.typed", "v1/__init__.py", "v1/a_pb2.py", "v1/a_pb2.pyi"):
        (pkg / rel).write_text("x")
    for rel in ("__pycache__/__init__.cpython-311.pyc", ".hidden/x.py", "notes.txt", "v1/a.proto"):
        (pkg / rel).write_text("x")
    assert [rel for rel, _ in sandbox_sources(tmp_path)] == [
        "sandbox/__init__.py",
        "sandbox/py.typed",
        "sandbox/v1/__init__.py",
        "sandbox/v1/a_pb2.py",
        "sandbox/v1/a_pb2.pyi",
    ]


def test_sandbox_sources_of_this_repo_include_generated_code():
    rels = [rel for rel, _ in sandbox_sources(REPO)]
    assert "sandbox/__init__.py" in rels
    assert any(rel.startswith("sandbox/v1/") and rel.endswith("_pb2.py") for rel in rels)
    assert not any("__pycache__" in rel for rel in rels)


def test_sandbox_sources_requires_the_package(tmp_path):
    with pytest.raises(ImageBuildError, match="sandbox package"):
        sandbox_sources(tmp_path)


# --- dependencies and wheels ------------------------------------------------------------------------


def test_dependency_pins_are_the_installed_versions():
    from importlib.metadata import version

    pins = wheels.dependency_pins()
    assert pins == {name: version(name) for name in ("grpcio", "protobuf", "psutil")}


def test_dependency_pins_missing_package_is_a_readable_error():
    with pytest.raises(ImageBuildError, match="not installed"):
        wheels.dependency_pins(("surely-not-installed-callbox-dep",))


def test_requirements_text():
    assert requirements_text({"psutil": "7.2.2", "grpcio": "1.85.3"}) == "grpcio==1.85.3\npsutil==7.2.2\n"


def test_manylinux_platforms_for_bookworm():
    tags = manylinux_platforms((2, 36), "x86_64")
    assert tags[0] == "manylinux_2_36_x86_64"
    for tag in ("manylinux2014_x86_64", "manylinux_2_17_x86_64", "manylinux_2_28_x86_64", "manylinux1_x86_64"):
        assert tag in tags
    assert "manylinux_2_37_x86_64" not in tags
    assert len(tags) == len(set(tags))


def test_manylinux_platforms_aarch64_and_unknown_glibc():
    tags = manylinux_platforms((2, 31), "aarch64")
    assert "manylinux2014_aarch64" in tags
    assert "manylinux2010_aarch64" not in tags
    assert manylinux_platforms(None, "x86_64")[0] == "manylinux_2_28_x86_64"
    assert manylinux_platforms((2, 36), "amd64")[0] == "manylinux_2_36_x86_64"


def test_pip_download_command_online():
    cmd = pip_download_command(
        dest=Path("/c/wh"),
        python=(3, 11),
        platforms=["manylinux_2_17_x86_64", "manylinux2014_x86_64"],
        pins={"psutil": "7.2.2", "grpcio": "1.85.3"},
        wheelhouse=None,
        executable="/py",
    )
    assert cmd[:4] == ["/py", "-m", "pip", "download"]
    joined = " ".join(cmd)
    assert "--only-binary=:all:" in cmd
    assert "--python-version 3.11" in joined
    assert "--implementation cp" in joined
    assert "--abi cp311" in joined
    assert "--platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64" in joined
    assert "--no-index" not in cmd
    pip_pin = f"pip=={importlib.metadata.version('pip')}"
    assert cmd[-5:] == ["-d", "/c/wh", pip_pin, "grpcio==1.85.3", "psutil==7.2.2"]


def test_pip_download_command_air_gapped():
    cmd = pip_download_command(
        dest=Path("/c/wh"), python=(3, 12), platforms=["p"], pins={}, wheelhouse=Path("/mnt/wheels")
    )
    assert "--no-index" in cmd
    assert cmd[cmd.index("--find-links") + 1] == "/mnt/wheels"
    assert "cp312" in cmd


def test_cached_wheels_manifest(tmp_path):
    assert wheels._cached_wheels(tmp_path, "k") is None
    (tmp_path / "pip-1-py3-none-any.whl").write_text("x")
    (tmp_path / wheels._WHEEL_MANIFEST).write_text(json.dumps({"key": "k", "files": ["pip-1-py3-none-any.whl"]}))
    assert wheels._cached_wheels(tmp_path, "k") == ["pip-1-py3-none-any.whl"]
    assert wheels._cached_wheels(tmp_path, "other") is None
    (tmp_path / "pip-1-py3-none-any.whl").unlink()
    assert wheels._cached_wheels(tmp_path, "k") is None


def test_parse_probe():
    info = parse_probe('warning: x\n{"python": [3, 11], "glibc": [2, 36], "machine": "x86_64"}\n')
    assert info == probe.BaseInfo(python=(3, 11), glibc=(2, 36), machine="x86_64")
    assert parse_probe('{"python": [3, 12], "glibc": null, "machine": "aarch64"}').glibc is None
    with pytest.raises(ValueError, match="unexpected"):
        parse_probe("(3, 11)\n")


def test_probe_script_runs_here():
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-I", "-c", probe._PROBE_SCRIPT], capture_output=True, text=True)
    info = parse_probe(out.stdout)
    assert info.python == sys.version_info[:2]


# --- tags, cache, context, pruning ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tag", "expected"),
    [
        ("callbox-sandbox:latest", ("callbox-sandbox", "latest")),
        ("callbox-sandbox", ("callbox-sandbox", "latest")),
        ("localhost:5000/team/box:v1.2", ("localhost:5000/team/box", "v1.2")),
    ],
)
def test_split_tag(tag, expected):
    assert split_tag(tag) == expected


@pytest.mark.parametrize("tag", ["Bad Tag", "UPPER:1", "a:b:c", "x@sha256:" + "0" * 64, "", "x:"])
def test_split_tag_rejects(tag):
    with pytest.raises(ImageBuildError, match="invalid image tag"):
        split_tag(tag)


def test_cache_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert build.cache_dir() == tmp_path / "callbox"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/ignored")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert build.cache_dir() == tmp_path / "home" / ".cache" / "callbox"


def test_default_repo_root_holds_the_sources():
    root = build.default_repo_root()
    assert (root / "sandbox" / "__init__.py").is_file()
    assert (root / "images" / "Dockerfile").is_file()


def test_build_context_layout(tmp_path):
    wheel = tmp_path / "pip-26.3-py3-none-any.whl"
    wheel.write_bytes(b"PK")
    ctx = context.build_context(
        "FROM x\n",
        [("sandbox/__init__.py", b"", 0), ("sandbox/v1/a_pb2.py", b"a = 1\n", 0)],
        tmp_path,
        [wheel.name],
        "grpcio==1\n",
    )
    with tarfile.open(fileobj=io.BytesIO(ctx.read())) as tar:
        names = tar.getnames()
        assert tar.extractfile("wheels/requirements.txt").read() == b"grpcio==1\n"  # type: ignore[union-attr]
        assert all(m.uid == 0 and m.gid == 0 for m in tar.getmembers())
        assert all(m.mode in (0o644, 0o755) for m in tar.getmembers())
    assert names[0] == "Dockerfile"
    for name in ("wheels", f"wheels/{wheel.name}", "sandbox", "sandbox/v1", "sandbox/v1/a_pb2.py"):
        assert name in names


def test_prune_keeps_copyright_files_only(tmp_path):
    doc = tmp_path / "usr/share/doc"
    (doc / "git").mkdir(parents=True)
    (doc / "git/copyright").write_text("c")
    (doc / "git/changelog.gz").write_text("x")
    (doc / "git/contrib").mkdir()
    (doc / "git/contrib/x").write_text("x")
    (doc / "nocopy").mkdir()
    (doc / "nocopy/README").write_text("x")
    (doc / "linked").symlink_to("git")
    base._prune_dir(doc, ("copyright",))
    assert sorted(p.relative_to(doc).as_posix() for p in doc.rglob("*")) == ["git", "git/copyright"]
    assert doc.is_dir()


def test_prune_rootfs_resets_host_files(tmp_path):
    for d in ("tmp", "var/tmp", "etc", "var/lib/apt/lists", "var/cache/apt/archives"):
        (tmp_path / d).mkdir(parents=True)
    (tmp_path / "var/lib/apt/lists/deb.example_dists_bookworm_InRelease").write_text("x")
    (tmp_path / "var/cache/apt/archives/x.deb").write_text("x")
    (tmp_path / "etc/resolv.conf").write_text("nameserver 10.0.0.1\n")
    (tmp_path / "etc/hostname").write_text("build-host\n")
    base._prune_rootfs(tmp_path)
    assert [p.name for p in (tmp_path / "var/lib/apt/lists").iterdir()] == ["partial"]
    assert not list((tmp_path / "var/cache/apt/archives").glob("*.deb"))
    assert (tmp_path / "etc/resolv.conf").read_text() == ""
    assert (tmp_path / "etc/hostname").read_text() == "localhost\n"
    assert (tmp_path / "tmp").stat().st_mode & 0o7777 == 0o1777


def test_mounts_under_nothing_for_a_fresh_dir(tmp_path):
    assert base._mounts_under(tmp_path) == []


def test_debootstrap_missing_says_how_to_install(monkeypatch):
    monkeypatch.setattr(base.shutil, "which", lambda *a, **k: None)
    with pytest.raises(ImageBuildError, match="apt-get install debootstrap"):
        base._debootstrap_binary()


# --- the Dockerfile ---------------------------------------------------------------------------------


def test_dockerfile_contract():
    text = (REPO / "images" / "Dockerfile").read_text()
    assert 'ENTRYPOINT ["/usr/bin/python3", "-I", "-S", "/opt/callbox/agent.py"]' in text
    assert not re.search(r"^\s*ENV\b", text, re.MULTILINE), "no ENV: nothing may leak into tool processes"
    assert "PYTHONPATH=" not in text
    assert "--target /opt/callbox/lib" in text
    assert "--no-index" in text
    assert re.search(r"^FROM \$\{BASE_IMAGE\}", text, re.MULTILINE)
    assert 'sys.path.insert(0, "/opt/callbox/lib")' in text
    assert "from sandbox.__main__ import main" in text
    # system-wide tool defaults, in files rather than ENV
    for setting in (
        "git config --system --replace-all safe.directory '*'",
        "git config --system user.name 'callbox sandbox'",
        "git config --system user.email 'sandbox@callbox.invalid'",
        "git config --system init.defaultBranch main",
        "'disable-pip-version-check = true'",
        "'break-system-packages = true'",
        "> /etc/pip.conf",
    ):
        assert setting in text, setting
    # classic builder (Docker 20.10 without BuildKit): no heredocs, no RUN --mount, no COPY --chmod
    instructions = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    assert not re.search(r"<<-?\s*['\"]?[A-Za-z]", instructions)
    assert not re.search(r"^\s*RUN\s+--", instructions, re.MULTILINE)
    assert not re.search(r"^\s*(COPY|ADD)\s+.*--chmod", instructions, re.MULTILINE)


# --- the seccomp profile ----------------------------------------------------------------------------

IO_URING = {"io_uring_setup", "io_uring_enter", "io_uring_register"}


def _profile():
    text = resources.files("harness").joinpath("data/seccomp.json").read_text()
    return json.loads(text)


def test_seccomp_profile_blocks_io_uring():
    profile = _profile()
    assert profile["defaultAction"] == "SCMP_ACT_ERRNO"
    assert profile.get("defaultErrnoRet", 1) == 1  # EPERM
    for rule in profile["syscalls"]:
        names = set(rule.get("names") or []) | ({rule["name"]} if "name" in rule else set())
        if rule["action"] in ("SCMP_ACT_ALLOW", "SCMP_ACT_LOG", "SCMP_ACT_TRACE"):
            assert not names & IO_URING, rule
    assert "io_uring" not in json.dumps(profile)


def test_seccomp_profile_is_otherwise_dockers_default():
    profile = _profile()
    allowed = {n for r in profile["syscalls"] if r["action"] == "SCMP_ACT_ALLOW" and not r.get("args")
               and not r.get("includes") and not r.get("excludes") for n in r["names"]}  # fmt: skip
    for name in ("read", "write", "openat", "execve", "wait4", "setresuid", "kill", "socketpair", "statx"):
        assert name in allowed
    for name in ("mount", "ptrace", "bpf", "unshare", "setns", "keyctl", "add_key", "kexec_load"):
        assert name not in allowed
    assert {a["architecture"] for a in profile["archMap"]} >= {"SCMP_ARCH_X86_64", "SCMP_ARCH_AARCH64"}
    clone3 = [r for r in profile["syscalls"] if r["names"] == ["clone3"]]
    assert clone3 and clone3[0]["action"] == "SCMP_ACT_ERRNO" and clone3[0]["errnoRet"] == 38  # ENOSYS


def test_seccomp_provenance_note_exists():
    note = (REPO / "harness" / "data" / "SECCOMP.md").read_text()
    assert "Apache" in note
    assert "io_uring_setup" in note
