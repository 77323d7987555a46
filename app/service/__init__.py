"""The HTTP service: app factory and lifespan (main.py), settings (config.py), one router per
concern (routes/), the batching inference worker (worker.py) and Prometheus metrics (metrics.py).
It uses app.inference and app.codecs; nothing below it imports it."""
