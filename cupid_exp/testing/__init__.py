"""Test tools the package ships, to run offline and against faults: ``stub_llm_server`` (an OpenAI-compatible model on
127.0.0.1 with faults, limits and the Batch API), ``inprocess`` (the same model in this process), ``fault_server``
(scripted replies), ``cupid_data`` (synthetic data sets). Nothing here imports pytest."""
