"""``python -m gateway`` is the ``statusgate`` command."""

from .cli import main

raise SystemExit(main())
