"""``python -m gateway`` is the ``statusgate`` command."""

from gateway.cli import main

raise SystemExit(main())
