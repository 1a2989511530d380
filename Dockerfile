# The gpuwarden image, from this checkout:   docker build -t gpuwarden:0.1.0 .
# (the tag config/kubernetes/daemonset.yaml names; docs/service.md, "Container image").
#
# Two stages: the first builds gpuwarden's wheel from the package's own files (.dockerignore lets nothing else of
# the checkout in: not a user's my.toml with its tokens, not a venv, not git history) and installs it, with the
# extras the manifests use, into /opt/gpuwarden; the image is the base and that tree alone. No layer of the image
# holds a file of the checkout, not even one deleted later.
#
# BASE: any image with Python 3.11+ and its venv module (Debian 12's, as python:3.11-slim-bookworm is).
# PIP_OPTIONS: pip's own. Offline, from a folder of wheels: put them in wheels/ in the checkout (the only other
# folder .dockerignore lets in), with the build backend,
#   pip wheel --wheel-dir wheels '.[journal,web]' 'setuptools>=77'
#   docker build --network none --build-arg PIP_OPTIONS="--no-index --find-links /src/wheels" -t gpuwarden:0.1.0 .
# (tests/integration/test_image.py builds it that way, from a Debian 12 base imported offline).
ARG BASE=python:3.11-slim-bookworm

FROM ${BASE} AS build
ARG PIP_OPTIONS=
COPY . /src
# The journal extra is systemd-python, compiled against libsystemd: where no wheel of it is given, the compiler
# and the headers are installed here, in the build stage only (the image needs libsystemd0, which Debian has).
RUN set -e; \
    if ! ls /src/wheels/systemd_python-*.whl >/dev/null 2>&1 && ! command -v cc >/dev/null; then \
        apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev pkg-config libsystemd-dev; \
    fi; \
    python3 -m venv /opt/gpuwarden; \
    /opt/gpuwarden/bin/pip wheel --no-cache-dir ${PIP_OPTIONS} --wheel-dir /tmp/wheels '/src[journal,web]'; \
    /opt/gpuwarden/bin/pip install --no-cache-dir --no-index --find-links /tmp/wheels 'gpuwarden[journal,web]'; \
    /opt/gpuwarden/bin/python -c 'import gpuwarden, systemd.journal, bcrypt, yaml'

FROM ${BASE}
COPY --from=build /opt/gpuwarden /opt/gpuwarden
# The same path as `make install`'s, so that node-problem-detector's plugin config works in both (docs/fleet.md)
ENV PATH=/opt/gpuwarden/bin:$PATH
EXPOSE 10440
ENTRYPOINT ["gpuwarden"]
CMD ["run"]
