"""Training: policies (default SmolLM2 fetch, tiny test policy) and trainers."""
