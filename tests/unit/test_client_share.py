"""The per-client limit is hard only when the operator sets it (the flag, or the key in the
configuration file); left at its default it is a work-conserving share, enforced by the start
line rather than refused."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from harness.cli.main import build_parser
from harness.cli.serve_quotas import door_quotas, hard_per_client
from harness.cli.server_config import apply_config
from harness.doors.grpc.sessions import DEFAULT_CLIENT_SHARE, Limits


def _settings(*argv: str) -> argparse.Namespace:
    door = [] if "--config" in argv else ["--grpc", "unix:/tmp/callbox-share-test.sock"]
    args = build_parser().parse_args(["serve", *door, *argv])
    apply_config(args)
    return args


def _file(tmp_path: Path, text: str) -> str:
    path = tmp_path / "callbox.toml"
    path.write_text('[doors.grpc]\nlisten = ""\n' + text)
    return str(path)


def test_the_default_is_a_share_not_a_limit(tmp_path: Path) -> None:
    for args in (_settings(), _settings("--config", _file(tmp_path, "[limits]\nmax_sandboxes = 40\n"))):
        assert args.max_per_client == DEFAULT_CLIENT_SHARE and hard_per_client(args) is None
        assert door_quotas(args.server_config, hard_per_client(args)).limits("anyone").live_sandboxes is None


@pytest.mark.parametrize("how", ["flag", "file"])
def test_an_explicit_per_client_limit_is_hard(tmp_path: Path, how: str) -> None:
    args = (_settings("--max-per-client", "5") if how == "flag"
            else _settings("--config", _file(tmp_path, "[limits]\nmax_per_client = 5\n")))
    assert hard_per_client(args) == 5
    if how == "file":  # the file's key is every client's live_sandboxes quota, in every door
        assert door_quotas(args.server_config, hard_per_client(args)).limits("anyone").live_sandboxes == 5


def test_a_quota_of_its_own_stays_hard_beside_the_default_share(tmp_path: Path) -> None:
    args = _settings("--config", _file(tmp_path, "[clients.ci.quotas]\nlive_sandboxes = 3\n"))
    keeper = door_quotas(args.server_config, hard_per_client(args))
    assert keeper.limits("ci").live_sandboxes == 3 and keeper.limits("anyone").live_sandboxes is None


def test_limits_keep_the_share_beside_an_optional_hard_limit() -> None:
    assert Limits().max_sandboxes_per_client is None and Limits().client_share == DEFAULT_CLIENT_SHARE
    with pytest.raises(ValueError, match="at least 1"):
        Limits(client_share=0)
