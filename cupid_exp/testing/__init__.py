"""Test tools the package ships, to run offline and against faults: ``stub_llm_server``, ``inprocess``,
``fault_server``, ``cupid_data``. Nothing here imports pytest."""
