"""reconcilers."""
