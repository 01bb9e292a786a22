"""cupid-exp: a Hydra-driven experiment runner for the CUPID benchmark (COLM 2025): ``data`` → ``settings`` → ``tasks``
→ ``evaluators`` → ``scoring`` → ``tracking`` / ``reporting``, over ``llm``, beside ``durability``, tied by ``job``."""

import os

# litellm fetches its price map from GitHub at import unless told otherwise, which also starts a retry
# thread that can deadlock `mlflow server` offline; set once here, before anything imports litellm.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

__version__ = "0.2.0"
