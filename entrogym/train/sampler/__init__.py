"""The sampler part: the rollout engine, the weight versions it samples with, and the
rollout pipeline that keeps sampling ahead of the update (``--max-staleness``)."""
