"""Test helpers: the stub LLM server, synthetic CUPID data and a CLI runner (also used by bench/)."""
