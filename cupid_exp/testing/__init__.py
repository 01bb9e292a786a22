"""Test tools the package ships, to run offline and against faults; nothing here imports pytest."""
