"""imex."""
