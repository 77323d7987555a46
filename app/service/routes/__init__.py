"""One router per concern: segment (inference), model (description), health (probes), metrics."""

from app.service.routes import health, metrics, model, segment

ROUTERS = (segment.router, model.router, health.router, metrics.router)
