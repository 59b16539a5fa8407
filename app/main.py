"""The web app: ``uvicorn app.main:app`` (``make serve``). Built by :func:`app.web.app.create_app`."""

from app.web.app import create_app

app = create_app()
