# tidal: build a wheel in one stage, install it in a slim one that runs as a non-root user.
# PYTHON_IMAGE: any Python 3.11 image; deploy/base-image.sh makes one from Debian's packages
# for a site without Docker Hub.
ARG PYTHON_IMAGE=python:3.11-slim
FROM ${PYTHON_IMAGE} AS build
# A C compiler and Python's headers, in this stage only: setup.py compiles the hot modules
# with mypyc (20-30% less CPU per signal), and the build fails rather than fall back to pure
# Python. python:3.11-slim has the headers; Debian's python3 (deploy/base-image.sh) needs
# python3-dev. The runtime stage below gets the wheel, no compiler. Versions are not pinned:
# this stage is thrown away, and a pin would break as Debian's point releases move on.
# hadolint ignore=DL3008
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends gcc libc6-dev \
    && if ! python -c 'import os, sys, sysconfig; sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))'; then \
         DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends python3-dev; fi \
    && rm -rf /var/lib/apt/lists/*
ENV TIDAL_COMPILE=required
WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY protocol ./protocol
COPY server ./server
COPY client ./client
COPY cli ./cli
COPY testing ./testing
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM ${PYTHON_IMAGE}
RUN useradd --system --uid 10001 --home-dir /data --shell /usr/sbin/nologin tidal \
    && mkdir -p /data \
    && chown tidal /data
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir --no-index /wheels/*.whl \
    && rm -rf /wheels
USER 10001
WORKDIR /data
VOLUME ["/data"]
# Every setting comes from the environment (see README, Configuration). Listening
# beyond loopback needs TIDAL_TOKEN: without it the server refuses to start.
ENV TIDAL_HOST=0.0.0.0 \
    TIDAL_PORT=7411 \
    TIDAL_DB=/data/tidal.db \
    TIDAL_LOG_FORMAT=json \
    TIDAL_METRICS_PORT=7412 \
    PYTHONUNBUFFERED=1
# 7412: Prometheus metrics, on by default in the image (published only where asked);
# 7480: HTTP/JSON and the console, where TIDAL_HTTP=0.0.0.0:7480 turns it on (compose does)
EXPOSE 7411 7412 7480
# Healthy only when the database is loaded and storage takes writes (see README, Health).
HEALTHCHECK --interval=10s --timeout=5s --start-period=60s --retries=3 \
    CMD ["tidal", "health", "--host", "127.0.0.1", "--timeout", "3"]
STOPSIGNAL SIGTERM
ENTRYPOINT ["tidal"]
CMD ["serve"]
