"""A task module that raises RuntimeError when imported (its set-up failed)."""

raise RuntimeError("configuration not ready")
