"""A policies folder that cannot be listed is one clear problem, never a traceback and never
read as an empty folder."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gateway import ConfigError
from gateway.settings.config import load_settings
from gateway.settings.policy import read_policies


def _config(tmp_path: Path, folder: str) -> Path:
    path = tmp_path / "gateway.yaml"
    path.write_text(f"policies_dir: {folder}\nstore: memory://\n")
    return path


def test_a_policies_dir_that_is_a_file_is_not_a_folder(tmp_path: Path) -> None:
    """policies_dir naming a file is reported as not a folder."""
    (tmp_path / "policies").write_text("not a folder")
    with pytest.raises(ConfigError) as caught:
        load_settings(_config(tmp_path, "policies"), env={})
    assert caught.value.problems == [f"{tmp_path}/policies: policies_dir: is not a folder"]


def test_a_policies_dir_that_cannot_be_listed_says_why(tmp_path: Path) -> None:
    """A folder the gateway's user may not list (a container's mount, say) is one problem
    naming the reason: before, glob read it as an empty folder (check said ok, 0 policies)
    and serve died with a PermissionError traceback. Listed as an unprivileged user (root
    may list anything: the test takes nobody's uid for the call, then its own back)."""
    folder = tmp_path / "policies"
    folder.mkdir(mode=0o000)
    root = os.geteuid() == 0
    if root:
        os.seteuid(65534)
    try:
        policies, _, problems = read_policies(folder, "config/policies", {})
    finally:
        if root:
            os.seteuid(0)
        folder.chmod(0o700)
    assert (policies, problems) == (
        {},
        ["config/policies: policies_dir: cannot be read (Permission denied)"],
    )
