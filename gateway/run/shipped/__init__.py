"""The files ``statusgate init`` writes: the starter config (``gateway.yaml`` beside this
module, a template) and the shipped policies.

The policies have one source, the repository's ``policies/`` folder. A wheel carries a copy of
its ``*.yaml`` at ``gateway/run/shipped/policies`` (setup.py's build_py makes it at build time); a
checkout, or an editable install, reads ``policies/`` itself. Writing never replaces a file
that is there unless the caller says so, and then every file is checked before any is written.
"""

from __future__ import annotations

import hashlib
import string
from collections.abc import Iterable
from pathlib import Path

from gateway import ConfigError

HERE = Path(__file__).resolve().parent
STARTER = HERE / "gateway.yaml"
CONFIG_NAME = "gateway.yaml"
POLICIES = "policies"


def policies_folder() -> Path:
    """The shipped policies: the wheel's copy, else the checkout's ``policies/``."""
    for folder in (HERE / POLICIES, HERE.parents[2] / POLICIES):
        if folder.is_dir():
            return folder
    raise ConfigError([f"{HERE / POLICIES}: the shipped policies are missing (a broken install)"])


def shipped_policies() -> dict[str, Path]:
    """Every shipped policy file by its name (the file name without ``.yaml``)."""
    folder = policies_folder()
    paths = sorted([*folder.glob("*.yaml"), *folder.glob("*.yml")])
    return {path.stem: path for path in paths}


def starter_files(
    names: Iterable[str] | None, agent_token: str, operator_token: str
) -> dict[str, str]:
    """The files of a starter folder by their relative path: the config, holding the sha256
    of each token, and the policies ``names`` (every shipped one when None)."""
    shipped = shipped_policies()
    chosen = sorted(shipped) if names is None else sorted(set(names))
    unknown = [name for name in chosen if name not in shipped]
    if unknown:
        known = ", ".join(shipped)
        raise ConfigError(
            [f"--policy {name}: no shipped policy of that name ({known})" for name in unknown]
        )
    config = string.Template(STARTER.read_text()).substitute(
        agent_token_sha256=_sha256(agent_token), operator_token_sha256=_sha256(operator_token)
    )
    if "demo-agent" not in chosen:  # its upstream entry names a policy not written
        config = "".join(
            line for line in config.splitlines(keepends=True) if "  demo-agent:" not in line
        )
    files = {CONFIG_NAME: config}
    for name in chosen:
        files[f"{POLICIES}/{shipped[name].name}"] = shipped[name].read_text()
    return files


def write(folder: Path, files: dict[str, str], force: bool) -> list[Path]:
    """``files`` written under ``folder``, their paths in order; nothing is written while one
    of them exists, unless ``force``."""
    targets = {folder / relative: text for relative, text in files.items()}
    if not force:
        there = [f"{path}: exists (--force replaces it)" for path in targets if path.exists()]
        if there:
            raise ConfigError(there)
    try:
        for path, text in targets.items():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    except OSError as exc:
        raise ConfigError([f"{exc.filename}: cannot write ({exc.strerror})"]) from None
    return list(targets)


def _sha256(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()
