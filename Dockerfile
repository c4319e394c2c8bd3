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
# The base is an ARG: any Debian-like image with Python 3.11 (python3 and its venv module) and
# apt-get. tests/deploy/test_container_image.py builds this file with podman on a local base
# made from Debian packages (no image registry needed), runs it and checks its HEALTHCHECK and a
# real client through it:
#
#   podman build --format docker --build-arg PYTHON_IMAGE=localhost/my-python:3.11 -t kinspect:0.1.0 .
#
# (--format docker keeps the HEALTHCHECK, which the OCI image format has no field for.)

ARG PYTHON_IMAGE=python:3.11-slim

# ------------------------------------------------------------------------------ builder
# Builds kinspect's wheel (with its C extensions, kinspect/protocol/codec/_wire.c, kinspect/session/_one_frame.c,
# kinspect/observers/_counting.c and _inventory.c, kinspect/proxy/_batch.c, _receive.c and _forward.c,
# kinspect/capture/_take.c, _columns.c, _derive.c, _count_later.c, _facts_wire.c and _pace.c,
# kinspect/analyze/_grouping.c) and installs it with
# the `proxy` extra into /opt/venv, which is all the runtime stage takes from here.
FROM ${PYTHON_IMAGE} AS builder

# Python's headers come with the python:*-slim images (/usr/local/include); with Debian's own
# Python they are the python3.X-dev package, added only when Python.h is missing.
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc libc6-dev $(python3 -c \
      'import os, sys, sysconfig; print("" if os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")) else "python%d.%d-dev" % sys.version_info[:2])') \
 && rm -rf /var/lib/apt/lists/*

WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY specs ./specs
COPY kinspect ./kinspect

# Behind a TLS-intercepting proxy pip must trust its CA: mount a bundle into the build and name
# it here, e.g. -v /etc/ssl/certs/ca-certificates.crt:/run/build-ca.crt:ro
# --build-arg BUILD_CA_BUNDLE=/run/build-ca.crt (a builder-stage ARG: not in the final image).
ARG BUILD_CA_BUNDLE=

# setup.py marks the extensions optional (a machine without a compiler still installs), so the
# import check makes a missing compiler fail the build here instead of shipping the slow path
# (-P: the installed package, not the source tree in the working directory).
RUN if [ -n "$BUILD_CA_BUNDLE" ]; then export PIP_CERT="$BUILD_CA_BUNDLE"; fi \
 && python3 -m venv /opt/venv \
 && /opt/venv/bin/pip wheel --no-cache-dir --no-deps --wheel-dir /wheels . \
 && /opt/venv/bin/pip install --no-cache-dir "$(ls /wheels/kinspect-*.whl)[proxy]" \
 && /opt/venv/bin/python -P -c "import kinspect.protocol.codec._wire, kinspect.session._one_frame, kinspect.observers._counting, kinspect.observers._inventory, kinspect.proxy._batch, kinspect.proxy._receive, kinspect.proxy._forward, kinspect.capture._take, kinspect.capture._columns, kinspect.capture._derive, kinspect.capture._count_later, kinspect.capture._facts_wire, kinspect.capture._pace, kinspect.analyze._grouping" \
 && /opt/venv/bin/python -m pip uninstall -y pip setuptools

# ------------------------------------------------------------------------------ runtime
# The same base (the venv's interpreter links point at the base's python3.11), no
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
