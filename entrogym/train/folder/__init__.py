"""The run folder on disk: its layout and safety (lock, resume checks), checkpoints and what
they restore (weights, optimizer, RNG, ``TrainState``), metrics and trackers."""
