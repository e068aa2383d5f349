"""Remote access: the SSH layer (and, later, the Kubernetes API layer)."""
