# The image `make image` builds without a container daemon (e2e/image), for where Docker exists:
#
#   docker build -t vkprovider:0.1.0 .
#
# The same layout: Debian bookworm with python3, ca-certificates and libstdc++6 (grpcio), a
# virtualenv at /opt/vkprovider with unchecked-hash bytecode compiled at build time (no pip in
# it), user vkprovider 65532:65532 whose home is /tmp, the same environment, working directory and
# entry point. Not the same bytes: the base is debian:bookworm-slim rather than an mmdebstrap
# tree, and pip resolves the dependencies here, where `make image` pins those of the project's
# .venv.

FROM debian:bookworm-slim AS build
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv \
    && rm -rf /var/lib/apt/lists/*
# What the wheel is built from (pyproject.toml names README.md), not the whole checkout.
COPY pyproject.toml README.md /src/
COPY vkprovider /src/vkprovider
COPY federation /src/federation
COPY e2e /src/e2e
RUN python3 -m venv /opt/vkprovider \
    && /opt/vkprovider/bin/pip install --no-cache-dir --no-compile /src \
    && /opt/vkprovider/bin/pip uninstall -y -q pip setuptools \
    && find /opt/vkprovider -name __pycache__ -prune -exec rm -rf {} + \
    && PYTHONHASHSEED=0 /opt/vkprovider/bin/python -m compileall -q --invalidation-mode unchecked-hash /opt/vkprovider/lib

FROM debian:bookworm-slim
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 ca-certificates libstdc++6 \
    && rm -rf /var/lib/apt/lists/* \
    && PYTHONHASHSEED=0 python3 -m compileall -q -f --invalidation-mode unchecked-hash /usr/lib/python3.11 \
    && groupadd --system --gid 65532 vkprovider \
    && useradd --system --uid 65532 --gid 65532 --home-dir /tmp --no-create-home \
        --shell /usr/sbin/nologin vkprovider
COPY --from=build /opt/vkprovider /opt/vkprovider
ENV PATH=/opt/vkprovider/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    HOME=/tmp \
    LANG=C.UTF-8 \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
# The chart's pod: runAsUser/runAsGroup 65532, read-only root filesystem, an emptyDir at /tmp.
USER 65532:65532
WORKDIR /tmp
ENTRYPOINT ["vkprovider"]
