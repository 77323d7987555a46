"""Training MinkUNet on synthetic scenes (synth/) and the real training-pool scans of
../shared/data/real (train/real.py: roles table; validation frames are only ever scored, by
train/validate.py and train/evaluate.py): augmentations, batches, the training loop.
"""
