"""`python3 bench/cluster ...` (or `python3 -m cluster ...` from bench/): see cli.py."""
import os
import sys

if not __package__:
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from cluster.cli import main
else:
    from .cli import main

sys.exit(main())
