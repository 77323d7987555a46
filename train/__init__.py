"""Training MinkUNet on synthetic scenes (synth/): augmentations, batches, the training loop.

Training never reads ../shared/data/real; those frames are for evaluation only (app/inference/scoring.py).
"""
