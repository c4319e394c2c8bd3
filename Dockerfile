# kinspect's container image: the sidecar proxy only (`kinspect proxy`), no PySpark.
#
#   docker build -t kinspect:0.1.0 .
#   docker run --rm -p 19092:19092 -p 9464:9464 \
#     -v "$PWD/my-kinspect.toml:/etc/kinspect/kinspect.toml:ro" kinspect:0.1.0
#
# The config is read from /etc/kinspect/kinspect.toml: mount yours there (a file with -v, or a
# ConfigMap on /etc/kinspect in Kubernetes). The image carries deploy/config/kinspect-sidecar.toml
# at that path as a default. Inside a container the listeners that must be reached from outside
# bind 0.0.0.0 (the sidecar config does this for metrics; see deploy/ for complete examples).
# tests/test_deploy_manifests.py builds what the builder stage builds, the same way, and checks
# the result and the HEALTHCHECK below against a running kinspect.

ARG PYTHON_IMAGE=python:3.11-slim

# ------------------------------------------------------------------------------ builder
# Builds kinspect's wheel (with its C extension, kinspect/protocol/_wire.c) and installs it with
# the `proxy` extra into /opt/venv, which is all the runtime stage takes from here.
FROM ${PYTHON_IMAGE} AS builder

RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc libc6-dev \
 && rm -rf /var/lib/apt/lists/*

WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY specs ./specs
COPY kinspect ./kinspect

# setup.py marks the extension optional (a machine without a compiler still installs), so the
# import check makes a missing compiler fail the build here instead of shipping the slow path.
RUN python -m venv /opt/venv \
 && /opt/venv/bin/pip wheel --no-cache-dir --no-deps --wheel-dir /wheels . \
 && /opt/venv/bin/pip install --no-cache-dir "$(ls /wheels/kinspect-*.whl)[proxy]" \
 && /opt/venv/bin/python -c "import kinspect.protocol._wire" \
 && /opt/venv/bin/python -m pip uninstall -y pip setuptools

# ------------------------------------------------------------------------------ runtime
# The same slim base (the venv's interpreter links point at its /usr/local/bin/python3.11), no
# compiler, no build files: the venv, the default config and an unprivileged user.
FROM ${PYTHON_IMAGE} AS runtime

RUN groupadd --system --gid 10001 kinspect \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin kinspect

COPY --from=builder /opt/venv /opt/venv
COPY deploy/config/kinspect-sidecar.toml /etc/kinspect/kinspect.toml

# Bytecode was compiled at install time; the root filesystem may be read-only (Kubernetes
# readOnlyRootFilesystem), so Python must not try to write more.
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    KINSPECT_HEALTHZ_URL=http://127.0.0.1:9464/healthz

# Numeric, so that Kubernetes' runAsNonRoot can verify it without reading /etc/passwd.
USER 10001:10001

# 19092: the Kafka listener of the example configs (rewrite mode adds node_port_base + node id);
# 9464: /metrics, /healthz and /readyz (metrics.listen).
EXPOSE 19092 9464

# The slim image has no curl: Python's urllib asks /healthz (any error or non-2xx exits 1).
# Set KINSPECT_HEALTHZ_URL when metrics.listen uses another port.
HEALTHCHECK --interval=15s --timeout=5s --start-period=10s --retries=3 \
  CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen(os.environ['KINSPECT_HEALTHZ_URL'], timeout=4)"]

ENTRYPOINT ["kinspect", "proxy"]
CMD ["--config", "/etc/kinspect/kinspect.toml"]
