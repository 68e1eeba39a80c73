"""Policy, log-probs, distributed wrap, trainer loop, checkpoints, metrics."""
