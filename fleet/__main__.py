"""`python -m fleet` runs the `fleet` command."""

from fleet.cli import main

raise SystemExit(main())
