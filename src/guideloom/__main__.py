"""``python -m guideloom`` runs the command line."""

from guideloom._cli import main

raise SystemExit(main())
