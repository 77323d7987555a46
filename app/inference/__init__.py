"""The inference pipeline: voxelize (Open3D: voxelize.py; its configuration and per-point rules:
voxel_config.py; without Open3D: voxelize_fallback.py), kernel maps, network and devoxelize as
timed stages (pipeline.py, with the STAGES names; its clocks: clocks.py), the one way to build it
from a weights argument and a device (builder.py), scoring against labelled frames (scoring.py)
and the spconv cross-check (crosscheck.py). It uses models and kernels, never the HTTP service or
the command line."""
