"""``python -m gateway`` is the ``statusgate`` command."""

from gateway.run.cli import main

raise SystemExit(main())
