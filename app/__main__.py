"""`python -m app`: see app/cli.py. The OpenMP variables are set first (app/threads.py), before
anything loads libgomp."""

from app.threads import configure_env

configure_env()

from app.cli import main  # noqa: E402

raise SystemExit(main())
