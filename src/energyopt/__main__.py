"""``python -m energyopt``: the ``energyopt`` command."""

from energyopt.cli import main

raise SystemExit(main())
