"""The fault matrix's parts (tests/test_fault_matrix.py): how each mode runs the CLI (``modes``), what each fault
switches on and how it is seen to have happened (``catalogue``), how a fault that is not the stub's is driven
(``drivers``: kill -9, a tracking server that dies, a full disk), and the invariants every cell is held to
(``invariants``)."""
