"""The learner part: the policy (LoRA), its optimizer and loss scaler, exact log-probs, the
update step, and the sampler/learner mismatch checks."""
