"""The environment of the demo: every provider credential the shipped policies read from
``${NAME}``, set to the demo provider's key, so ``make run`` and ``statusgate demo`` serve
every shipped policy against the demo provider and no real key is ever sent to it.

``python -m gateway.demo.env [--export] [POLICIES_DIR]`` prints them as ``NAME=value`` lines
for ``env``, or as ``export NAME=value`` lines for a shell's ``eval``.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import yaml

from gateway.demo.jobs import DEFAULT_KEY
from gateway.settings.shapes import with_shape

# ${NAME} without a default (one with a default needs nothing)
_REQUIRED = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def demo_env(folder: Path, key: str) -> dict[str, str]:
    """Every ``${NAME}`` the policies in ``folder`` require, set to ``key``: those the files
    write and those their shapes fill (``aws-job``'s ``${AWS_ACCESS_KEY_ID}``)."""
    names: set[str] = set()
    for path in sorted([*folder.glob("*.yaml"), *folder.glob("*.yml")]):
        text = "\n".join(line.split("#", 1)[0] for line in path.read_text().splitlines())
        names.update(_REQUIRED.findall(text))
        try:
            raw = yaml.safe_load(text)
        except yaml.YAMLError:
            continue  # check names what is wrong with the file
        if isinstance(raw, dict):
            names.update(_REQUIRED.findall(json.dumps(with_shape(raw))))
    return dict.fromkeys(sorted(names), key)


def main() -> None:
    args = sys.argv[1:]
    export = "--export" in args
    folders = [arg for arg in args if arg != "--export"]
    folder = Path(folders[0] if folders else "policies")
    key = os.environ.get("DEMO_API_KEY", DEFAULT_KEY)
    for name, value in demo_env(folder, key).items():
        print(f"{'export ' if export else ''}{name}={value}")


if __name__ == "__main__":
    main()
