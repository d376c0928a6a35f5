# The loadgen image: one package, the same version for master and workers.
#
#   docker build -t loadgen:0.1.0 .
#   docker run --rm loadgen:0.1.0 --help
#   docker run --rm loadgen:0.1.0 worker --master-host 10.0.0.2
#
# No secrets are baked in: the target's API key arrives at run time as an environment
# variable named by `--api-key-env` (Kubernetes Secret, systemd EnvironmentFile, `docker run -e`).

ARG PYTHON_VERSION=3.12

# Build stage: turn the source tree into wheels (loadgen and every dependency), so the
# runtime stage installs from local files and keeps no source, compiler or build cache.
FROM python:${PYTHON_VERSION}-slim-bookworm AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY . .
RUN pip wheel --wheel-dir /wheels .

FROM python:${PYTHON_VERSION}-slim-bookworm
LABEL org.opencontainers.image.title="loadgen" \
      org.opencontainers.image.description="Load generation for LLM inference: Locust master and workers" \
      org.opencontainers.image.licenses="Apache-2.0"

# PYTHONDONTWRITEBYTECODE: pip compiles bytecode at install time, so the process never needs
# to write next to its modules and the root filesystem can be mounted read-only.
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# Only the runtime package: no dev extra (pytest, ruff) and no routers extra.
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    pip install --no-index --find-links /wheels loadgen

# A fixed numeric uid/gid so Kubernetes can check runAsNonRoot and fsGroup can make volumes writable.
RUN groupadd --system --gid 10001 loadgen \
 && useradd --system --uid 10001 --gid 10001 --home-dir /home/loadgen --create-home \
        --shell /usr/sbin/nologin loadgen \
 && mkdir -p /results /config \
 && chown 10001:10001 /results

USER 10001:10001
WORKDIR /home/loadgen

# 8089: the master's web UI; 5557: where workers connect to the master (Locust uses no other port).
EXPOSE 8089 5557
VOLUME ["/results"]

ENTRYPOINT ["loadgen"]
CMD ["--help"]
