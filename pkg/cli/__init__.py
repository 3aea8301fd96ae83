"""Command-line tools for users and operators (``kubectl computedomain``)."""
