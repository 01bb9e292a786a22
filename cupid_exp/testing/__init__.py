"""Test tools the package ships: stand-in providers to try the runner offline and to test it against faults.

- ``stub_llm_server``: a deterministic OpenAI-compatible model on 127.0.0.1 that answers every CUPID step
  well-formed, injects what real providers do (latency, 429 with ``retry-after``, 5xx, timeouts, malformed
  bodies, context-length errors, refusals), enforces a key's limits (``rate_limits``) and serves the Batch API
  (``batch_api``). ``python -m cupid_exp.testing.stub_llm_server --port 8011``, then point any role's ``api_base``
  at ``http://127.0.0.1:8011/v1``.
- ``inprocess``: the same model served in this process as the litellm provider ``inproc/<name>`` (the stub's
  replies and the faults that need no wire), for tests that need neither a server nor a process of their own.
- ``fault_server``: a server that answers from a script of (status, body, headers), for one exact fault.
- ``cupid_data``: synthetic CUPID-schema data sets and the overrides that point a job's roles at a stub.

Used by ``tests/`` and ``bench/``. Nothing here imports pytest (``tests/test_layers.py``).
"""
