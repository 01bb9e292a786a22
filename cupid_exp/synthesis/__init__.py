"""Synthesis of CUPID-style data: personas, context factors, 13-session journeys, dialogues, instances."""
