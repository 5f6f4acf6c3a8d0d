# The Eroica image: every service of docker-compose.yml runs `eroica <command>`.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /src
COPY . /src
# stream: confluent-kafka, faust; sink: clickhouse-driver (and chdb, unused when a server is configured)
RUN pip install '.[stream,sink]' \
    && useradd --system --create-home --uid 10001 eroica \
    && mkdir -p /data && chown eroica /data

USER eroica
WORKDIR /home/eroica
ENTRYPOINT ["eroica"]
CMD ["--help"]
