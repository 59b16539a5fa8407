"""The planning domain: configs, layer roles, stages, boundary checks, receipts.

Nothing in this package imports the web stack (FastAPI, Jinja2, Plotly) or pydantic, so the
``isplan check`` release gate starts fast.
"""
