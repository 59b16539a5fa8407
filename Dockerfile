# isplan web app. tests/test_install.py runs the same install and start steps in a fresh venv
# (pip install ., python -m app.serve, GET /healthz), so this file stays honest without a
# Docker engine on the build machine.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
RUN useradd --create-home --uid 10001 isplan
WORKDIR /src
COPY pyproject.toml README.md ./
COPY app ./app
COPY templates ./templates
COPY static ./static
RUN python -m venv /opt/venv && /opt/venv/bin/pip install --no-cache-dir .

USER isplan
WORKDIR /home/isplan
ENV ISPLAN_DATA_DIR=/home/isplan/data
EXPOSE 8000
HEALTHCHECK --interval=30s --timeout=5s --start-period=10s --retries=3 \
  CMD ["/opt/venv/bin/python", "-c", "import sys, urllib.request; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=4).status == 200 else 1)"]
# several server processes (ISPLAN_SERVER_WORKERS, default 2) with header/body deadlines: app/serve.py
CMD ["/opt/venv/bin/python", "-m", "app.serve", "--host", "0.0.0.0", "--port", "8000"]
