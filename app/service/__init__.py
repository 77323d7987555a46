"""The HTTP service: app factory and lifespan (main.py), settings (config.py), the state and
errors every part shares (state.py), API keys (auth.py), one router per concern (routes/), the
batching inference worker (worker.py; how it forms a batch: batch_forming.py), Prometheus
metrics (metrics.py), tracing and the request log (observe.py, tracing.py, access_log.py,
recent.py), uvicorn's protocol hardened (guard.py) and uvicorn with the SIGTERM drain (server.py,
the one entry the command line starts it through). It uses app.inference and app.codecs (the
pipeline comes from app.inference.builder); nothing below it imports it."""
