# Statusgate gateway image. The config and policies are mounted from outside:
#   docker run -p 8080:8080 -v $PWD/deploy:/config -v statusgate-data:/data \
#     -e ACME_API_KEY=... statusgate
# /config/gateway.yaml must listen on 0.0.0.0:8080 and keep its SQLite file under /data.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app
COPY pyproject.toml README.md ./
COPY gateway ./gateway
RUN pip install . \
    && useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin statusgate \
    && mkdir -p /data /config \
    && chown statusgate /data

USER statusgate
EXPOSE 8080
VOLUME ["/data"]

HEALTHCHECK --interval=15s --timeout=3s --start-period=5s --retries=3 \
  CMD python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8080/healthz', timeout=2)"

ENTRYPOINT ["statusgate"]
CMD ["serve", "--config", "/config/gateway.yaml"]
