"""`python -m app`: see app/cli.py. A stop signal is held from the first line (app/stop_signals.py);
the OpenMP variables (app/threads.py) and glibc's malloc parameters (app/heap.py) are set before
anything loads libgomp or starts a thread."""

from app import stop_signals

stop_signals.hold()

from app.heap import configure_malloc  # noqa: E402
from app.threads import configure_env  # noqa: E402

configure_env()
configure_malloc()

from app.cli import main  # noqa: E402

raise SystemExit(main())
