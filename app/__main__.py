"""`python -m app`: see app/cli.py."""
from .cli import main

raise SystemExit(main())
