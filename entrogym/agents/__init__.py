"""LLM agent, inference engines and rollout collection."""
