# The gpuwarden image, from this checkout:   docker build -t gpuwarden:0.1.0 .
# (the tag config/kubernetes/daemonset.yaml names; docs/service.md, "Container image").
# BASE: any image with Python 3.11+ and its venv module. PIP_OPTIONS: pip's own, e.g. to install from a folder
# of wheels in the build context where no package index is reachable: "--no-index --find-links /src/wheels"
# (tests/integration/test_image.py builds it that way, from a Debian 12 base imported offline).
ARG BASE=python:3.11-slim-bookworm
FROM ${BASE}
ARG PIP_OPTIONS=
COPY . /src
RUN python3 -m venv /opt/gpuwarden \
    && /opt/gpuwarden/bin/pip install --no-cache-dir ${PIP_OPTIONS} /src \
    && rm -rf /src
# The same path as `make install`'s, so that node-problem-detector's plugin config works in both (docs/fleet.md)
ENV PATH=/opt/gpuwarden/bin:$PATH
EXPOSE 10440
ENTRYPOINT ["gpuwarden"]
CMD ["run"]
