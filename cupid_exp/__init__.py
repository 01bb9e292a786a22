"""cupid-exp: a Hydra-driven experiment runner for the CUPID benchmark."""

import os

# litellm fetches its price map from GitHub at import unless told otherwise; set it before any import.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

__version__ = "0.1.0"
