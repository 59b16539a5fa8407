"""isplan: the IndexShare layout planner for GLM-5.2-class models."""

__version__ = "0.1.0"
