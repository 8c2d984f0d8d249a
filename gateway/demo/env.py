"""The environment of the demo: every provider credential the shipped policies read from
``${NAME}``, set to the demo provider's key, so ``make run`` and ``statusgate demo`` serve
every shipped policy against the demo provider and no real key is ever sent to it.

``python -m gateway.demo.env [--export] [POLICIES_DIR]`` prints them as ``NAME=value`` lines
for ``env``, or as ``export NAME=value`` lines for a shell's ``eval``.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

from gateway.demo.jobs import DEFAULT_KEY

# ${NAME} without a default (one with a default needs nothing)
_REQUIRED = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def demo_env(folder: Path, key: str) -> dict[str, str]:
    """Every ``${NAME}`` the policies in ``folder`` require, set to ``key``."""
    names: set[str] = set()
    for path in sorted([*folder.glob("*.yaml"), *folder.glob("*.yml")]):
        text = "\n".join(line.split("#", 1)[0] for line in path.read_text().splitlines())
        names.update(_REQUIRED.findall(text))
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
