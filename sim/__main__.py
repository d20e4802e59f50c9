"""``python -m sim`` runs the ``gpipe-sim`` command line."""

from sim.cli import main

raise SystemExit(main())
