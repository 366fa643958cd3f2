# syntax=docker/dockerfile:1
# gpufleet: the exporter, analyzer and advisor in one small image.
#
#   docker build -t REGISTRY/gpufleet:0.1.0 --build-arg REVISION="$(git rev-parse HEAD)" .
#   docker build --target node -t REGISTRY/gpufleet-node:0.1.0 .
#   docker build --target slurm -t REGISTRY/gpufleet-slurm:0.1.0 \
#     --build-arg SLURM_PACKAGES="slurm-client=22.05.8-4+deb12u3 munge" .
#
# Two images (issue 30): `node` is `pip install .`, what node mode (NVML, the DaemonSet)
# needs, without numpy (node mode never loads it); the default, `full`, adds every extra
# (`.[analysis,all]`: numpy for the analysis, the advisor and the simulated fleet, the
# kubernetes source, the kubelet's PodResources, the plots and the dashboard generator)
# for cluster mode.
#
# The base image is pinned by digest, so a rebuild gets the same Python and Debian until
# the digest is changed on purpose. To update it:
#   docker buildx imagetools inspect python:3.11-slim-bookworm   # the index "Digest:"
# then replace the sha256 below (keep the tag beside it, for the reader) and rebuild.
# This digest was not resolved from this repository's machines (no registry access): it is
# the one a public project lists as its verified python:3.11-slim-bookworm; check it as
# above before the first build (docs/deploy.md, "The image").
ARG PYTHON_IMAGE=python:3.11-slim-bookworm@sha256:2e32f7d302adc1c37428355c1e646897c0c53f4fd60b6a551245fb90ee129f91

FROM ${PYTHON_IMAGE} AS node

ARG VERSION=0.1.0
ARG REVISION=unknown
ARG PYTHON_IMAGE
LABEL org.opencontainers.image.title="gpufleet" \
      org.opencontainers.image.description="Prometheus exporter, fragmentation analyzer and rebalancing advisor for GPU fleets" \
      org.opencontainers.image.source="https://github.com/gpufleet/gpufleet" \
      org.opencontainers.image.documentation="https://github.com/gpufleet/gpufleet/blob/main/docs/deploy.md" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.base.name="${PYTHON_IMAGE}"

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /src
COPY pyproject.toml README.md ./
COPY exporter ./exporter
# exporter/thresholds.yaml links to the threshold table; pip copies its content in
COPY rules/thresholds.yaml ./rules/thresholds.yaml
# and exporter/runbooks.md to the runbooks that serve shows at /runbooks
COPY docs/runbooks.md ./docs/runbooks.md
# The generated rules and dashboards, to copy out of the image (docker cp, an init
# container); `gpufleet rules --out DIR` and `gpufleet dashboards --out DIR` regenerate them
# from the installed table.
COPY rules/gpufleet-*.yaml /usr/share/gpufleet/rules/
COPY dashboards/*.json /usr/share/gpufleet/dashboards/
# A node's install (docs/deploy.md): setuptools builds the one wheel from pyproject.toml and
# pip installs it with its dependencies; `make run` adds [analysis], `make test` [all,test].
RUN pip install --no-cache-dir . \
    && useradd --system --uid 10001 --no-create-home gpufleet \
    && mkdir -p /var/lib/gpufleet && chown 10001 /var/lib/gpufleet

# Non-root, by uid, so Kubernetes' runAsNonRoot can check it without /etc/passwd.
USER 10001
# the advisor's durable outbox (gpufleet-outbox.sqlite) lives here: mount a volume
WORKDIR /var/lib/gpufleet
EXPOSE 9874
HEALTHCHECK --interval=30s --timeout=3s --start-period=20s --retries=3 \
    CMD ["python", "-c", "import urllib.request,sys; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:9874/-/healthy', timeout=2).status == 200 else 1)"]
ENTRYPOINT ["gpufleet", "serve"]

# The full image: node mode's plus every extra (pyproject.toml's [all]; [analysis] named
# too, though matplotlib brings numpy), for cluster mode.
FROM node AS full
USER 0
WORKDIR /src
# DL3013 (pin versions): this is the checkout's own package; pyproject.toml bounds its extras.
# hadolint ignore=DL3013
RUN pip install --no-cache-dir '.[analysis,all]'
USER 10001
WORKDIR /var/lib/gpufleet

# Optional: the full image plus a site's Slurm client, for the slurm source in a container
# (`--target slurm`). The client must match the controller's Slurm version, so the
# packages are a build argument (Debian 12 ships 22.05). At run time, mount the site's
# /etc/slurm and munge's socket folder /run/munge (docs/deploy.md).
FROM full AS slurm
ARG SLURM_PACKAGES="slurm-client munge"
USER 0
# DL3008 (pin apt versions): the versions are the build argument's to pin, as above.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends ${SLURM_PACKAGES} \
    && rm -rf /var/lib/apt/lists/*
USER 10001

# The default target (a plain `docker build .`): the full image without Slurm. Listed last
# because a build without --target builds the last stage; BuildKit skips `slurm` then.
FROM full AS default
