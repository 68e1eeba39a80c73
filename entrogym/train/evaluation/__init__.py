"""Evaluation: eval plans and scores, the correlation and target-tracking summaries, and the
plots drawn from a run's metrics."""
