"""lidarseg application, in layers (imports only go down; tests/test_layers.py checks it):

service/    HTTP: app factory and lifespan, settings, routes, worker, metrics, server
inference/  the pipeline (voxelize, maps, network, devoxelize), the builder, scoring,
            the spconv cross-check
codecs/     wire formats in and out, frames on disk (used by the service and the CLI)
cli.py      `python -m app` (segment, crosscheck, evaluate, client, serve)
client.py   a standalone HTTP client
"""
