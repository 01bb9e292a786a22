"""Every model call: litellm clients, usage accounting, and the shared ask → parse → re-ask step."""
