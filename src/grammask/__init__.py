"""grammask."""
