"""The model steps of synthesis (persona and factors, sessions, dialogues, checklists and their validation), each
writing text into a slot code has laid out."""

from cupid_exp.synthesis.steps.base import SynthContext
from cupid_exp.synthesis.steps.dialogue import simulate_dialogue
from cupid_exp.synthesis.steps.factors import write_changed_preference, write_factors, write_persona
from cupid_exp.synthesis.steps.sessions import first_message, write_session
from cupid_exp.synthesis.steps.validation import decompose, validate_persona

__all__ = ["SynthContext", "decompose", "first_message", "simulate_dialogue", "validate_persona",
           "write_changed_preference", "write_factors", "write_persona", "write_session"]
