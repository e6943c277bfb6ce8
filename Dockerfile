# syntax=docker/dockerfile:1
# One image for the operator, the router and the vLLM worker emulator: `xpyd operator`,
# `xpyd router`, `xpyd emulate`. Build: docker build -t ghcr.io/xpyd/xpyd:0.1.0 .
# Released for linux/amd64 and linux/arm64 (make image, .github/workflows/release.yml): the base
# digest below must stay a multi-platform index digest.

# Pinned by digest: python 3.11.10 on Debian 12 (bookworm), slim variant.
ARG PYTHON_IMAGE=python:3.11.10-slim-bookworm@sha256:5148c0e4bbb64271bca1d3322360ebf4bfb7564507ae32dd639322e4952a6b16

# --- build: make the wheel and install it with its dependencies into a virtual environment ---
FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY api/ api/
COPY httpkit/ httpkit/
COPY operator/ operator/
COPY router/ router/
COPY emulator/ emulator/
COPY perf/ perf/
COPY simulator/ simulator/
COPY cluster/ cluster/
COPY cli/ cli/
COPY dashboards/ dashboards/
COPY charts/xpyd_chart/ charts/xpyd_chart/
RUN python -m venv /opt/xpyd \
    && /opt/xpyd/bin/pip install --no-compile "setuptools>=69" wheel \
    && /opt/xpyd/bin/pip wheel --no-deps --wheel-dir /wheels . \
    && /opt/xpyd/bin/pip install /wheels/xpyd-*.whl \
    && /opt/xpyd/bin/pip uninstall --yes setuptools wheel \
    && /opt/xpyd/bin/python -m compileall -q /opt/xpyd

# --- runtime: the virtual environment on a clean base, run as an unprivileged user ---
FROM ${PYTHON_IMAGE} AS runtime
LABEL org.opencontainers.image.title="xpyd" \
      org.opencontainers.image.description="Operator, KV-aware router and worker emulator for disaggregated LLM serving" \
      org.opencontainers.image.source="https://github.com/xpyd/xpyd" \
      org.opencontainers.image.licenses="Apache-2.0"
RUN groupadd --gid 65532 xpyd \
    && useradd --uid 65532 --gid 65532 --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin xpyd
COPY --from=build /opt/xpyd /opt/xpyd
ENV PATH=/opt/xpyd/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
WORKDIR /tmp
USER 65532:65532
# 8000: router and emulator HTTP; 8080: the operator's liveness endpoint; 9090: operator metrics.
EXPOSE 8000 8080 9090
ENTRYPOINT ["xpyd"]
CMD ["--help"]
