"""``python -m energyopt.cli``."""

from energyopt.cli import main

raise SystemExit(main())
