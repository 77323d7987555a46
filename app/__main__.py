"""`python -m app`: see app/cli.py. The OpenMP variables (app/threads.py) and glibc's malloc
parameters (app/heap.py) are set first, before anything loads libgomp or starts a thread."""

from app.heap import configure_malloc
from app.threads import configure_env

configure_env()
configure_malloc()

from app.cli import main  # noqa: E402

raise SystemExit(main())
