"""``callbox template build|ls|rm`` through the real CLI, on the real engine, in a template directory of its own."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.engine.image.engine import image_with_hash
from tests.conftest import IMAGE
from tests.integration.helpers import callbox

pytestmark = pytest.mark.docker


@pytest.fixture(name="store")
def store_fixture(tmp_path: Path, engine: Any) -> Iterator[dict[str, str]]:
    env = {"CALLBOX_TEMPLATE_DIR": str(tmp_path / "templates")}
    try:
        yield env
    finally:
        for entry in (tmp_path / "templates" / "cache").glob("*"):
            for image in engine.client.images.list(filters={"label": f"callbox.template.key={entry.name}"}):
                engine.client.images.remove(image.id, force=True)


def test_build_ls_rm_an_operators_template(tmp_path: Path, store: dict[str, str], engine: Any) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "index.html").write_text(f"page {secrets.token_hex(6)}\n")
    args = ("template", "build", "web", "--from-image", IMAGE, "--copy", f"{site}:/srv/site/",
            "--run", "test -f /srv/site/index.html", "--env", "PORT=8000",
            "--start", "python3 -m http.server 8000", "--ready", "curl -s localhost:8000")
    built = callbox(*args, env=store)
    assert built.returncode == 0, built.stderr.decode()
    name, template_id, image = built.stdout.decode().split()
    assert name == "web" and image.startswith("callbox-template:")
    assert b"Step " in built.stderr
    # Built on callbox's image, it still starts callbox's agent, but it is never taken for the
    # image build whose content hash it inherited (that once tagged a template as the sandbox image).
    base_hash = engine.client.images.get(IMAGE).labels["callbox.image.hash"]
    template_hash = engine.client.images.get(image).labels["callbox.image.hash"]
    assert template_hash == f"{base_hash}+template"
    assert image_with_hash(engine.client, base_hash, f"callbox-sandbox:{base_hash[:12]}") == \
        engine.client.images.get(IMAGE).id

    again = callbox(*args, env=store)
    assert again.returncode == 0, again.stderr.decode()
    assert again.stdout.decode().split() == [name, template_id, image]
    assert b"cached:" in again.stderr and b"Step " not in again.stderr

    listed = callbox("template", "ls", env=store)
    assert listed.returncode == 0
    row = next(line for line in listed.stdout.decode().splitlines() if line.startswith("web "))
    assert template_id in row and image in row and "python3 -m http.server 8000" in row

    failed = callbox("template", "build", "broken", "--from-image", IMAGE, "--run", "exit 3", env=store)
    assert failed.returncode != 0
    assert b"step 0" in failed.stderr and b"returned a non-zero code: 3" in failed.stderr

    missing = callbox("template", "build", "nope", "--from-image", "callbox-test/absent:0", env=store)
    assert missing.returncode != 0
    assert b"callbox-test/absent:0" in missing.stderr and b"not on this host" in missing.stderr

    removed = callbox("template", "rm", "web", env=store)
    assert removed.returncode == 0, removed.stderr.decode()
    assert "web" not in callbox("template", "ls", env=store).stdout.decode()
    assert callbox("template", "rm", "web", env=store).returncode != 0
