# gpufleet: the exporter, analyzer and advisor in one small image.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /src
COPY pyproject.toml README.md ./
COPY exporter ./exporter
# exporter/thresholds.yaml links to the threshold table; pip copies its content in
COPY rules/thresholds.yaml ./rules/thresholds.yaml
# The generated rules and dashboards, to copy out of the image (docker cp, an init
# container); `gpufleet rules --out DIR` and `gpufleet dashboards --out DIR` regenerate them
# from the installed table.
COPY rules/gpufleet-*.yaml /usr/share/gpufleet/rules/
COPY dashboards/*.json /usr/share/gpufleet/dashboards/
# The same `pip install .` that `make run` and `make test` run.
RUN pip install --no-cache-dir . \
    && useradd --system --uid 10001 --no-create-home gpufleet \
    && mkdir -p /var/lib/gpufleet && chown 10001 /var/lib/gpufleet

USER 10001
# the advisor's durable outbox (gpufleet-outbox.sqlite) lives here: mount a volume
WORKDIR /var/lib/gpufleet
EXPOSE 9874
HEALTHCHECK --interval=30s --timeout=3s --start-period=20s --retries=3 \
    CMD ["python", "-c", "import urllib.request,sys; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:9874/-/healthy', timeout=2).status == 200 else 1)"]
ENTRYPOINT ["gpufleet", "serve"]
