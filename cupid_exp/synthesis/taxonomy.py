"""The paper's fixed vocabularies: persona attributes (Table 5) and the taxonomies (Table 7); our seed personas."""

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
FACTOR_TYPES = tuple(FACTOR_TYPE_HINTS)
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


# Fallback factor names, per factor type: used only when the factor writer, asked again, still names
# a factor that another of the persona's factors already has (or a generic label). The factor's
# background and preference stay the model's; the swap is recorded on the factor ("name_source")
# and counted in the job's report (factors/names_from_taxonomy). Written for this project.
FALLBACK_FACTOR_NAMES = {
    "Person/Group": ("their line manager", "their closest colleague", "their younger sister", "the weekend book club",
                     "their long-time mentor", "the neighbourhood parents' group", "their oldest friend",
                     "the new intern they supervise"),
    "Organization/Institution": ("the local city council", "their professional association", "the regional bank",
                                 "the community college", "their health insurer", "the tenants' union",
                                 "the public library service", "their former employer"),
    "Object/Artifact": ("their worn paper notebook", "the household budget binder", "their old film camera",
                        "the family recipe box", "their annual performance review", "the lease contract",
                        "their field guide", "the inherited piano"),
    "Content/Media": ("a weekly industry newsletter", "their favourite history podcast",
                      "a long-running cooking channel", "the local evening news", "a popular science magazine",
                      "an online forum for their trade", "a documentary series", "an audiobook they are reading"),
    "Tool/Technology": ("their shared team spreadsheet", "a budgeting app", "their smartwatch",
                        "the company chat tool", "a photo-editing program", "their e-reader",
                        "a route-planning app", "the office printer"),
    "Location/Place": ("the corner café", "their home office", "the public swimming pool", "the allotment garden",
                       "the train commute", "their parents' house", "the downtown gym", "the harbour walk"),
    "Process/Activity": ("the Monday planning meeting", "their evening run", "the quarterly report cycle",
                         "weekly grocery shopping", "the Sunday family call", "their language lessons",
                         "the yearly tax return", "volunteering at the food bank"),
    "Event/Time": ("the end-of-year holidays", "an upcoming job interview", "the spring inspection season",
                   "a cousin's wedding", "the first week of school", "a planned move to a new flat",
                   "the annual conference", "a hospital appointment next month"),
}

# Seed persona descriptions, one per occupation, ours (``synthesis.persona_source=builtin``).
SEED_DESCRIPTIONS: tuple[str, ...] = (
    "A paediatric nurse on rotating night shifts at a city hospital",
    "A hydrologist modelling flood risk for river towns",
    "A secondary-school history teacher who runs the debate club",
    "A freelance illustrator making covers for children's books",
    "A backend software engineer maintaining a payments platform",
    "A dairy farmer moving the herd to organic certification",
    "A court interpreter working between Spanish and English",
    "A restaurant sous-chef planning seasonal tasting menus",
    "A structural engineer inspecting old railway bridges",
    "A public librarian who organises digital-literacy workshops",
    "A wildlife biologist tracking wolves in mountain forests",
    "A small-business accountant preparing quarterly tax filings",
    "A physiotherapist helping athletes recover from knee surgery",
    "A long-haul truck driver who plans routes across the continent",
    "A museum curator assembling an exhibition on textile history",
    "A social worker supporting families in foster care",
    "An electrician wiring solar panels on family homes",
    "A data journalist investigating local housing prices",
    "A pharmacist running a rural community pharmacy",
    "A game designer prototyping a cooperative board game",
    "A commercial airline pilot training for a new aircraft type",
    "A UX researcher interviewing users of a banking app",
    "A carpenter restoring wooden boats in a harbour workshop",
    "A primary-school special-education teacher",
    "A hotel front-desk manager at a busy seaside resort",
    "A climate policy analyst at a regional government office",
    "A veterinary surgeon specialising in horses",
    "A music producer recording independent folk bands",
    "A warehouse logistics coordinator for an online retailer",
    "A patent attorney handling biotechnology applications",
    "A marathon coach writing training plans for amateurs",
    "A translator of crime novels from Japanese",
    "A dental hygienist who also teaches part-time at a college",
    "A city bus mechanic maintaining an electric fleet",
    "A real-estate agent selling homes in a growing suburb",
    "A research chemist developing biodegradable plastics",
    "A wedding photographer who runs a small studio",
    "A high-school robotics club mentor and physics teacher",
    "A fundraising manager at an animal-rescue charity",
    "A retired police officer who volunteers as a youth sports referee",
    "A beekeeper selling honey at farmers' markets",
    "A cybersecurity analyst monitoring a hospital network",
)
