"""The paper's fixed vocabularies: persona attributes (Table 5) and the taxonomies (Table 7)."""

from __future__ import annotations

# Table 5. Career levels are written as the paper lists them; traits are only the paper's four
# (upstream adds Extroversion), each at High or Low.
CAREER_LEVELS = (
    "Entry-level/Beginner/Novice",
    "Mid-level/Intermediate/Associate",
    "Senior-level/Advanced/Expert",
)
BIG_FIVE_TRAITS = ("Openness to Experience", "Conscientiousness", "Agreeableness", "Neuroticism")
TRAIT_LEVELS = ("High", "Low")
PERSONALITY_TRAITS = tuple(f"{level} {trait}" for trait in BIG_FIVE_TRAITS for level in TRAIT_LEVELS)
PERSONAL_VALUES = ("Self-Direction", "Achievement", "Universalism", "Power", "Stimulation", "Benevolence",
                   "Security", "Tradition", "Conformity", "Hedonism")
DECISION_STYLES = ("Analytical", "Directive", "Conceptual", "Behavioral")

# Table 7.
FACTOR_TYPES = ("Person/Group", "Organization/Institution", "Object/Artifact", "Content/Media",
                "Tool/Technology", "Location/Place", "Process/Activity", "Event/Time")
FACTOR_TYPE_HINTS = {
    "Person/Group": "a specific person or group of people",
    "Organization/Institution": "a specific organization or institution",
    "Object/Artifact": "a specific object, document or possession",
    "Content/Media": "a specific piece of content or media",
    "Tool/Technology": "a specific tool, app or technology",
    "Location/Place": "a specific place",
    "Process/Activity": "a specific recurring activity or process",
    "Event/Time": "a specific event or period of time",
}
PREFERENCE_TYPES_BY_DIMENSION = {
    "Style": ("Formality", "Clarity", "Conciseness", "Vividness", "Format", "Tone"),
    "Informativeness": ("Relevance", "Depth", "Creativity", "Efficiency", "Practicality"),
    "Harmlessness": ("Accuracy", "Morality", "Safety", "Sensitivity", "Trustworthiness"),
}
PREFERENCE_TYPES = tuple(t for types in PREFERENCE_TYPES_BY_DIMENSION.values() for t in types)
TASK_TYPES = ("Information seeking", "Learning", "Reasoning", "Planning", "Content creating", "Communicating",
              "Writing & editing", "Coding & debugging", "Problem solving", "Data analysing", "Advise seeking",
              "Brainstorming")


def trait_name(trait: str) -> str:
    """'High Neuroticism' -> 'Neuroticism'."""
    return trait.split(" ", 1)[1]
