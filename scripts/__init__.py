"""Developer scripts, run from the repository root: ``python -m scripts.<name>``."""
