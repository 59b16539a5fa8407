"""``python -m app`` is the ``isplan`` command."""

from app.cli import main

raise SystemExit(main())
