"""Template recipes: what the SDK sends, checked whole; their cache key; the Dockerfile they make."""

from __future__ import annotations

import json

import pytest

from harness.core.errors import CallboxError, ErrorCode
from harness.engine.templates.steps import Recipe, dockerfile, dockerfile_lines, parse_recipe

HASH = "ab" * 32


def _body(**extra: object) -> dict[str, object]:
    return {"fromImage": "e2bdev/base", "force": False, "steps": [
        {"type": "COPY", "args": ["app/main.py", "/home/user/", "user", "0755"], "filesHash": HASH, "force": False},
        {"type": "RUN", "args": ["pip install -r requirements.txt && echo 'done \"now\"'"], "force": False},
        {"type": "ENV", "args": ["PORT", "8000", "GREETING", "say \"hi\" $HOME"], "force": False},
        {"type": "WORKDIR", "args": ["/app"], "force": False},
        {"type": "RUN", "args": ["whoami", "root"], "force": False},
    ], "startCmd": "python3 main.py", "readyCmd": "curl -s localhost:8000", **extra}


def test_a_recipe_keeps_every_step_and_its_commands() -> None:
    recipe = parse_recipe(_body())
    assert [step.type for step in recipe.steps] == ["COPY", "RUN", "ENV", "WORKDIR", "RUN"]
    assert recipe.files_hashes == [HASH]
    assert recipe.start_cmd == "python3 main.py"
    assert recipe.workdir() == "/app"
    assert recipe.env_names() == ["PORT", "GREETING"]
    assert parse_recipe(recipe.to_json()) == recipe


def test_the_cache_key_follows_the_base_the_steps_and_the_files_not_the_start_command() -> None:
    recipe = parse_recipe(_body())
    key = recipe.cache_key("sha256:1")
    assert key == parse_recipe(_body(startCmd="other", readyCmd="other")).cache_key("sha256:1")
    assert key != recipe.cache_key("sha256:2")
    changed_files = json.loads(json.dumps(_body()))
    changed_files["steps"][0]["filesHash"] = "cd" * 32
    assert key != parse_recipe(changed_files).cache_key("sha256:1")
    changed_run = json.loads(json.dumps(_body()))
    changed_run["steps"][1]["args"] = ["true"]
    assert key != parse_recipe(changed_run).cache_key("sha256:1")


def test_the_dockerfile_writes_each_step_with_nothing_left_to_the_shell_of_docker() -> None:
    text = dockerfile(parse_recipe(_body()), "callbox-sandbox:latest", {"callbox.template.key": "k"})
    lines = text.splitlines()
    assert lines[0] == "FROM callbox-sandbox:latest"
    assert 'COPY --chown=root ["step-0/app/main.py", "/home/user/"]' in lines  # E2B's "user" builds as root
    assert ('RUN ["/bin/sh", "-c", "pip install -r requirements.txt && echo \'done \\"now\\"\'"]') in lines
    assert 'ENV PORT="8000" GREETING="say \\"hi\\" $HOME"' in lines
    assert "WORKDIR /app" in lines
    assert lines[-1] == 'LABEL "callbox.template.key"="k"'


def test_labels_replacing_the_bases_come_first_so_every_image_of_the_build_has_them() -> None:
    lines = dockerfile_lines(parse_recipe(_body()), "img", {"callbox.template.key": "k"},
                             {"callbox.image.hash": "h+template"})
    assert lines[:2] == [("FROM img", "base"), ('LABEL "callbox.image.hash"="h+template"', "base")]
    assert lines[-1] == ('LABEL "callbox.template.key"="k"', "finalize")


def test_each_dockerfile_line_names_the_step_the_sdk_reports_a_failure_at() -> None:
    lines = dockerfile_lines(parse_recipe(_body()), "img")
    assert [step for _, step in lines] == ["base", "base", "0", "1", "2", "3", "4", "finalize"]


def test_a_run_step_as_another_user_switches_and_switches_back() -> None:
    body = _body()
    body["steps"] = [{"type": "USER", "args": ["app"]}, {"type": "RUN", "args": ["id", "root"]},
                     {"type": "RUN", "args": ["id"]}]
    lines = dockerfile(parse_recipe(body), "img").splitlines()
    assert lines[2:7] == ["USER app", "USER root", 'RUN ["/bin/sh", "-c", "id"]', "USER app",
                          'RUN ["/bin/sh", "-c", "id"]']


@pytest.mark.parametrize(("step", "words"), [
    ({"type": "ARG", "args": ["x"]}, "step type 'ARG' is not supported"),
    ({"type": "COPY", "args": ["../etc/passwd", "/x"], "filesHash": HASH}, "inside the template's directory"),
    ({"type": "COPY", "args": ["a", "/x"]}, "filesHash"),
    ({"type": "ENV", "args": ["ODD"]}, "name, value pairs"),
    ({"type": "ENV", "args": ["1BAD", "v"]}, "not an environment variable name"),
    ({"type": "RUN", "args": [""]}, "RUN needs a command"),
    ({"type": "USER", "args": ["a b"]}, "USER needs one user name"),
])
def test_a_step_it_cannot_build_is_refused_naming_it(step: dict[str, object], words: str) -> None:
    with pytest.raises(CallboxError, match=r"steps\[0\]") as refused:
        parse_recipe({"fromImage": "x", "steps": [step]})
    assert words in refused.value.message
    assert refused.value.code is ErrorCode.INVALID_REQUEST


def test_registry_credentials_are_refused_not_kept() -> None:
    with pytest.raises(CallboxError, match="pulls from no registry") as refused:
        parse_recipe({"fromImage": "private/img", "fromImageRegistry": {"type": "registry", "username": "u",
                                                                          "password": "secret"}, "steps": []})
    assert refused.value.code is ErrorCode.NOT_SUPPORTED
    assert "secret" not in refused.value.message


def test_a_template_base_wins_over_an_image() -> None:
    recipe = parse_recipe({"fromImage": "e2bdev/base", "fromTemplate": "parent", "steps": []})
    assert recipe == Recipe(from_template="parent")
