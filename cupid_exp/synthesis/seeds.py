"""Seed persona descriptions shipped with the package: one short line per occupation.

Written for this project (not taken from PersonaHub) to cover many fields, ages of career and
kinds of work; ``synthesis.persona_source=builtin`` draws from this list with the run's seed.
"""

from __future__ import annotations

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
