# Statusgate gateway image. The config and policies are mounted from outside:
#   docker run -p 8080:8080 -v /srv/statusgate/config:/config -v statusgate-data:/data \
#     -e ACME_API_KEY=... statusgate
# /config/gateway.yaml must listen on 0.0.0.0 and keep its SQLite file under /data. The
# HEALTHCHECK reads the config named by STATUSGATE_CONFIG to find listen.port: when you serve
# another file (docker run ... statusgate serve --config X), set STATUSGATE_CONFIG=X too.
#
# Build it with `make image` (deploy/image/build.sh: docker, or buildah where no Docker
# engine runs): the tag is pyproject.toml's version, the one the Kubernetes
# manifests name (deploy/kubernetes/base/kustomization.yaml, checked by tests/test_kubernetes.py);
# the build fails when VERSION and the package's version differ. Kubernetes ignores
# HEALTHCHECK and probes /healthz and /readyz itself; the image runs with a read-only root
# file system there (it writes only to /tmp and its data volume).
# The base: python:3.11-slim, or, where no registry is reachable, a Debian 12 base that
# deploy/image/build.sh makes from Debian's packages (python3, python3-venv); the gateway
# lives in a virtualenv of its own either way.
ARG BASE=python:3.11-slim
FROM ${BASE}

ARG VERSION=unset
LABEL org.opencontainers.image.title="statusgate" \
      org.opencontainers.image.description="A policy gateway between AI agents and asynchronous provider jobs" \
      org.opencontainers.image.version="${VERSION}"

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    STATUSGATE_CONFIG=/config/gateway.yaml \
    PATH=/opt/statusgate/bin:$PATH

WORKDIR /app
RUN python3 -m venv /opt/statusgate

# Runtime dependencies at pinned versions (the postgres extra included, so one image serves
# every store), in their own layer so code changes reuse it. The wheels are downloaded by
# deploy/image/build.sh on the build machine (build/image/deps), so the build itself needs no
# network: the same on a machine whose registry access goes through its own proxy.
# requirements.lock is generated, not edited: `make lock` regenerates it from pyproject.toml.
COPY requirements.lock ./
COPY build/image/deps /tmp/deps
RUN pip install --no-index --find-links /tmp/deps --no-deps -r requirements.lock \
    && rm -rf /tmp/deps

# The gateway itself, the wheel `make dist` builds, without resolving anything again; pip
# check fails the build when the lock no longer satisfies pyproject.toml.
COPY build/image/app /tmp/app
COPY deploy/docker/healthcheck.py /usr/local/bin/statusgate-healthcheck
RUN pip install --no-index --no-deps /tmp/app/*.whl \
    && rm -rf /tmp/app \
    && pip check \
    && test "$(statusgate --version)" = "statusgate ${VERSION}" \
    && groupadd --system --gid 10001 statusgate \
    && useradd --system --uid 10001 --gid 10001 --no-create-home --shell /usr/sbin/nologin statusgate \
    && mkdir -p /data /config \
    && chown 10001:10001 /data

USER 10001:10001
EXPOSE 8080
VOLUME ["/data"]

# GET /healthz on the port the mounted config names (listen.port); see the script.
HEALTHCHECK --interval=15s --timeout=5s --start-period=10s --retries=3 \
  CMD ["python", "/usr/local/bin/statusgate-healthcheck"]

ENTRYPOINT ["statusgate"]
CMD ["serve", "--config", "/config/gateway.yaml"]
