"""The built-in vLLM simulator: engine model, metric rendering per vLLM version, load and trace replay."""
