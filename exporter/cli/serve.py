"""``gpufleet serve``: read the sources, serve /metrics and the JSON API."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import logging
import signal
import socket
import sys
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from exporter.config import DEFAULT_LISTEN, Config, ConfigError, describe, load
from exporter.extras import not_installed
from exporter.sources import SOURCES, Clock, SourceStartupError, build_source
from exporter.web.listen import parse_listen

# `serve --help` needs only the option declarations above (exporter.config, the sources'
# registry): the server, aiohttp and the exposition (numpy) are imported where they run,
# which keeps --help from paying for them (docs/performance.md, "A lean node")
if TYPE_CHECKING:
    from aiohttp import web

    from exporter.advisor.service import AdvisorService
    from exporter.collect import Collector
    from exporter.cycle import Stage
    from exporter.cycle.serving import ServingCycle
    from exporter.exposition import ExpositionOptions
    from exporter.metrics import Family
    from exporter.thresholds import Thresholds
    from exporter.thresholds.reloading import LiveThresholds
    from exporter.web.server import Protection, ServingState
    from exporter.web.webconfig import LiveWebConfig

log = logging.getLogger("gpufleet")

DESCRIPTION = "Serve /metrics for a GPU fleet. Flags override the config file."
EPILOG = "config file options (YAML, dotted keys are nested mappings):\n" + "\n".join(describe())


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="FILE", help="YAML config file (every key has a default)")
    parser.add_argument("--listen", metavar="HOST:PORT",
                        help=f"address to serve on (default {DEFAULT_LISTEN})")
    parser.add_argument("--source", choices=sorted(SOURCES),
                        help="read only this source (default: those enabled in the config, sim)")
    parser.add_argument("--seed", type=int, metavar="N", help="seed of the simulated fleet")
    parser.add_argument("--log-level", choices=("debug", "info", "warning", "error"))
    parser.add_argument("--log-format", choices=("logfmt", "json"))
    parser.add_argument("--thresholds", metavar="FILE",
                        help="the threshold table whose levels the advisor and the analysis "
                        "default to, read again on SIGHUP and when it changes (default "
                        "thresholds_file, else the table installed with gpufleet)")
    parser.add_argument("--web.config.file", dest="web_config_file", metavar="FILE",
                        help="node_exporter's web config file: TLS, basic auth, headers "
                        "(exporter-toolkit format; default web.config_file)")


def effective_config(args: argparse.Namespace) -> Config:
    """The config file with command-line flags applied on top."""
    config = load(args.config)
    if args.listen:
        try:
            parse_listen(args.listen)
        except ValueError as exc:
            raise ConfigError(f"--{exc}") from None
        config = dataclasses.replace(config, listen=args.listen)
    if getattr(args, "thresholds", None):
        config = dataclasses.replace(config, thresholds_file=args.thresholds)
    if getattr(args, "web_config_file", None):
        config = dataclasses.replace(
            config, web=dataclasses.replace(config.web, config_file=args.web_config_file))
    log_config = config.log
    if args.log_level:
        log_config = dataclasses.replace(log_config, level=args.log_level)
    if args.log_format:
        log_config = dataclasses.replace(log_config, format=args.log_format)
    sources = config.sources
    if args.source:
        changes = {}
        for f in dataclasses.fields(sources):
            current = getattr(sources, f.name)
            changes[f.name] = dataclasses.replace(current, enabled=(f.name == args.source))
        sources = dataclasses.replace(sources, **changes)
    if args.seed is not None:
        if args.seed < 0:
            raise ConfigError("--seed: must be >= 0")
        sources = dataclasses.replace(sources, sim=dataclasses.replace(sources.sim, seed=args.seed))
    config = dataclasses.replace(config, log=log_config, sources=sources)
    config.check("")  # again: --source may enable a source whose options break a rule
    return config


def enabled_sources(config: Config) -> list[str]:
    return [f.name for f in dataclasses.fields(config.sources)
            if getattr(config.sources, f.name).enabled]


def run(args: argparse.Namespace) -> int:
    # the config before the server's modules (aiohttp, the exposition): a bad file or flag is
    # told in 0.3 s, not 0.76
    config = effective_config(args)
    try:
        host, port = parse_listen(config.listen)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    import asyncio

    from aiohttp import web

    from exporter import logs
    from exporter.web.server import make_app, serve
    from exporter.web.webconfig import LiveWebConfig

    logs.setup(config.log.level, config.log.format, queued=True)
    # SIGHUP's default action kills the process; until serve() takes it over, the files are
    # being read anyway. A handler, not SIG_IGN: an ignored signal stays ignored in children
    signal.signal(signal.SIGHUP, _sighup_during_start)
    names = enabled_sources(config)
    if not names:
        raise ConfigError("sources: no source is enabled (enable sources.sim, or pass --source)")
    # the web config first: a bad one stops the start before any source or store is opened
    live = LiveWebConfig(config.web.config_file) if config.web.config_file else None
    reload_files: dict[str, Callable[[], bool]] = {}  # the table's reload gauge reads them
    try:
        collector, state, advisor = assemble(config, names, reload_files=reload_files)
    except SourceStartupError as exc:
        print(f"gpufleet: {exc}", file=sys.stderr)
        return 2
    guard = protection(config, advisor, live)
    state.reloaders.extend(reloaders(guard, advisor, config, reload_files))
    app = make_app(config, collector, state, guard)
    from exporter.web import runbooks

    runbooks.add_route(app)  # the alerts' runbook_url under external_url (issue 29)
    if advisor is not None:
        from exporter.advisor.service import install

        install(app, advisor)
    else:  # the snapshot is still served: say so at /v1/openapi.json
        from exporter.web.server import OPENAPI_PATH

        app.router.add_get(OPENAPI_PATH, _lazy_openapi())
        from exporter.cycle.serving import ServingCycle

        if isinstance(state.cycle, ServingCycle) and state.cycle.deliverer is not None:
            # remediation events without the advisor: the cycle's store delivers them; first
            # in, so last out, after the collection loop that writes to it has stopped
            app.cleanup_ctx.insert(0, state.cycle.background)
    try:
        sock = socket.create_server((host, port), reuse_port=False)
    except OSError as exc:
        print(f"gpufleet: cannot listen on {host}:{port}: {exc.strerror} "
              "(pick another with --listen HOST:PORT)", file=sys.stderr)
        return 1
    what = "the simulated fleet" if names == ["sim"] else ", ".join(names)
    scheme = "https" if guard.web is not None and guard.web.tls else "http"
    print(f"gpufleet serving {what} at {metrics_url(sock.getsockname(), scheme)}", flush=True)
    log.info("serving", extra={"listen": f"{host}:{port}", "sources": ",".join(names)})
    with contextlib.suppress(web.GracefulExit, KeyboardInterrupt):
        asyncio.run(serve(app, sock, config.web))
    log.info("stopped")
    return 0


def _lazy_openapi() -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """``GET /v1/openapi.json`` without the advisor, its document made at the first request:
    the advisor's modules load numpy, which a node serving /metrics never needs."""
    handler: list[Callable[[web.Request], Awaitable[web.StreamResponse]]] = []

    async def get_openapi(request: web.Request) -> web.StreamResponse:
        if not handler:
            try:
                from exporter.advisor.api import openapi_handler
            except ModuleNotFoundError as exc:  # a node's install: numpy is [analysis]'s
                if (line := not_installed(exc, "serve", "GET /v1/openapi.json")) is None:
                    raise
                from aiohttp import web

                return web.json_response({"error": line}, status=501)
            handler.append(openapi_handler(advisor=False))
        return await handler[0](request)

    return get_openapi


def _sighup_during_start(signum: int, frame: object) -> None:
    log.info("SIGHUP while starting: ignored, the files are being read now")


def reloaders(guard: Protection, advisor: AdvisorService | None = None,
              config: Config | None = None,
              reloads: dict[str, Callable[[], bool]] | None = None,
              ) -> list[tuple[str, Callable[[], object]]]:
    """What SIGHUP reads again (exporter/web/server.py, Reload): the web config file, the
    advisor's token file and its receivers' HMAC ``secret_file``s. A token or secret from the
    environment cannot change under a running process. ``reloads`` (assemble's
    ``reload_files``) learns whether each file's last read succeeded: a failed one sets
    ``gpufleet_config_last_reload_successful`` to 0 while its last good version stays."""
    from exporter.advisor.token_file import TokenFile  # not the service: no numpy on a node

    found: list[tuple[str, Callable[[], object]]] = []
    live = guard.web
    if live is not None:
        found.append(("web_config", lambda: "changed" if live.poll(force=True) else "unchanged"))
        if reloads is not None:  # its watcher reads it again too: its state, not the last SIGHUP's
            reloads["web_config"] = live.read_well
    token = guard.read_token
    if isinstance(token, TokenFile):  # the advisor's too: protection() hands over the same one

        def token_file() -> str:
            value = token(force=True)
            return "read" if token.ok else "kept" if value else "refused"

        found.append(("token_file", token_file))
        if reloads is not None:  # a POST reads it again too: its state, not the last SIGHUP's
            reloads["token_file"] = lambda: token.ok
    if advisor is not None and config is not None and any(
            r.secret_file for r in config.advisor.receivers):
        from exporter.advisor.service import reload_secret_files

        deliverer, settings = advisor.deliverer, config.advisor
        secrets_ok = [True]

        def receiver_secrets() -> str:
            outcome = reload_secret_files(settings, deliverer)
            secrets_ok[0] = not outcome.endswith("kept")
            return outcome

        found.append(("receiver_secrets", receiver_secrets))
        if reloads is not None:
            reloads["receiver_secrets"] = lambda: secrets_ok[0]
    return found


def metrics_url(address: tuple, scheme: str = "http") -> str:
    """The /metrics URL of the address the socket is bound to, as it is: a wildcard is said.

    >>> metrics_url(("0.0.0.0", 9874))
    'http://0.0.0.0:9874/metrics (every IPv4 interface)'
    >>> metrics_url(("::", 9874, 0, 0))
    'http://[::]:9874/metrics (every interface)'
    """
    host, port = address[0], address[1]
    shown = f"[{host}]" if ":" in host else host
    url = f"{scheme}://{shown}:{port}/metrics"
    if host == "0.0.0.0":
        return f"{url} (every IPv4 interface)"
    if host == "::":
        return f"{url} (every interface)"
    return url


def exposition_options(config: Config, names: list[str], sources: list) -> ExpositionOptions:
    """``exposition.per_gpu`` resolved: ``auto`` is off when the GPU telemetry comes from
    the ``prometheus`` source (cluster mode), on for node and relay sources (sim, nvml,
    dcgm). A source that reads the scheduler (role ``allocation``: Slurm) or is one (the
    simulator, ``schedules``) makes this process the producer of the scheduler's joins
    (exporter/exposition/options.py, ExpositionOptions). NVML knows no jobs, unless it reads the
    kubelet's PodResources (``pod_resources``: ``schedules`` then); dcgm knows them from
    dcgm-exporter's pod labels (``schedules`` too)."""
    from exporter.exposition import ExpositionOptions

    setting = config.exposition.per_gpu
    per_gpu = "prometheus" not in names if setting == "auto" else setting == "true"
    reads_scheduler = any(getattr(s, "role", "full") == "allocation"
                          or getattr(s, "schedules", False) for s in sources)
    return ExpositionOptions(per_gpu=per_gpu, reads_scheduler=reads_scheduler,
                             cluster=config.cluster)


def protection(config: Config, advisor: AdvisorService | None,
               live: LiveWebConfig | None) -> Protection:
    """The web config file (``--web.config.file`` or ``web.config_file``, loaded) and whether
    GET /v1/* needs the advisor's token: by default when the file is set, because then the
    operator has asked for the endpoints to be protected."""
    from exporter.web.server import Protection

    reads = config.api.require_token_for_reads
    if reads is None:
        reads = live is not None
    if advisor is not None:
        token = advisor.token
    else:
        from exporter.advisor.token_file import load_token

        token = load_token(config.advisor)
    if reads and not token:
        log.warning("GET /v1/* refuses every request: api.require_token_for_reads is on and "
                    "no advisor token is configured (set GPUFLEET_ADVISOR_TOKEN or "
                    "advisor.token_file)")
    if live is not None:
        log.info("web config loaded", extra={"path": live.path, "tls": live.tls,
                                             "users": len(live.current.users)})
        if live.current.users and not live.tls:  # allowed, as in exporter-toolkit, but said
            log.warning("basic auth without TLS: passwords cross the network in clear "
                        "(set tls_server_config in the web config file)")
    return Protection(live, token, reads)


def assemble(config: Config, names: list[str], clock: Clock = time.time,
             timer: Clock = time.perf_counter,
             reload_files: dict[str, Callable[[], bool]] | None = None,
             ) -> tuple[Collector, ServingState, AdvisorService | None]:
    """The sources, collector, analyzer and advisor that ``serve`` runs, wired as it runs them.

    ``clock`` (wall time) and ``timer`` (durations) are parameters so that the golden
    exposition (tests/golden/) renders the same bytes on every run. ``reload_files``, filled
    by :func:`reloaders`, is what the threshold table's reload gauge reads of the other
    files (LiveThresholds.other_files).
    """
    from exporter.collect import Collector
    from exporter.cycle.serving import HealthEffects, ServingCycle, advisor_stage
    from exporter.cycle.stages import AnalysisStage, HealthStage, LoadStage, TableStage
    from exporter.health.settings import build_health  # not the advisor's: no numpy on a node
    from exporter.preemption.stage import PreemptionStage, watch_settings
    from exporter.preemption.watch import PreemptionWatch
    from exporter.thresholds.reloading import LiveThresholds
    from exporter.web.server import ServingState

    table = LiveThresholds(config.thresholds_file or None, clock)  # a bad one stops the start
    sources = [build_source(n, getattr(config.sources, n), clock) for n in names]
    collector = Collector(sources, config.source_timeout, clock=clock, timer=timer)
    state = ServingState(exposition=exposition_options(config, names, sources))
    # first: every later stage judges the snapshot by the table on disk then
    stages: list[Stage] = [TableStage(table)]
    if state.exposition.per_gpu:  # the NVLink gauge is per-GPU telemetry: served with it only
        from exporter.cycle.nvlink import NvlinkStage

        stages.append(NvlinkStage())
    advisor = None
    analyzer = None
    load = None
    if config.analysis.enabled:
        from exporter.analysis.analyzer import LiveAnalyzer
        from exporter.pool_load.tracker import LoadTracker

        analyzer = LiveAnalyzer.from_config(config.analysis, table.current)
        load = LoadTracker.from_table(config.analysis.window_snapshots, table.current)
        stages += [AnalysisStage(analyzer), LoadStage(load)]
    monitor = build_health(config.advisor, table.current)
    stages.append(HealthStage(monitor))
    stages.append(PreemptionStage(PreemptionWatch(watch_settings(config.advisor, table.current))))
    deliverer = None
    if analyzer is not None and config.advisor.enabled:
        from exporter.advisor.service import build_service

        advisor = build_service(config.advisor, analyzer, what_if_timeout=config.api.what_if_timeout,
                                table=table.current, health=monitor)
        deliverer = advisor.deliverer
        stages.append(advisor_stage(advisor, load))
    else:
        if config.advisor.enabled:
            log.warning("advisor disabled: it needs analysis.enabled")
        if config.advisor.receivers:  # remediation events still reach the scheduler
            from exporter.advisor.service import build_deliverer

            deliverer = build_deliverer(config.advisor)
    health = HealthEffects(monitor, deliverer)
    health.restore()
    state.cycle = cycle = ServingCycle(stages, health, advisor, extra=(("logs", log_families),),
                                       deliverer=deliverer if advisor is None else None)
    follow_table(table, config, cycle)
    if reload_files is not None:
        table.other_files = reload_files
    state.reloaders.append(("thresholds", lambda: table.poll(force=True)))
    return collector, state, advisor


def follow_table(table: LiveThresholds, config: Config, cycle: ServingCycle) -> None:
    """What a reloaded threshold table changes: the analysis' compaction threshold and the
    pools' scaling settings, and the advisor's trigger, clear bound and checkpoint interval
    (the planner's too), where the config leaves them at their defaults
    (exporter/thresholds/defaults.py), and its reclaim rule (GpuJobUtilizationLow), and the
    health monitor's settings (the table's ``health`` section, less advisor.health's overrides:
    its verdicts, drains and straggler clocks stay). The
    advisor's state (dwell, cooldown, plan in force, idle clocks), the analyzer's window and
    the scalers' state stay: only settings are replaced. A clear bound set in the config at or
    above the new trigger refuses the table (advise.decision_settings), and the old one stays."""
    from exporter.cycle.stages import AdvisorStage, AnalysisStage, HealthStage, LoadStage
    from exporter.health.settings import health_settings
    from exporter.thresholds.scaling import DEFAULT as DEFAULT_SCALING

    analysis, load = cycle.stage("analysis"), cycle.stage("load")
    if isinstance(analysis, AnalysisStage):
        # the analysis' and the advisor's modules load numpy: only where they run
        from exporter.analysis.configure import index_settings

        analyzer = analysis.analyzer
        tracker = load.tracker if isinstance(load, LoadStage) else None

        def analysis_follower(new: Thresholds) -> Callable[[], None]:
            settings = index_settings(config.analysis, new)
            scaling = new.scaling or DEFAULT_SCALING

            def commit() -> None:
                analyzer.settings = settings
                if tracker is not None:
                    tracker.retable(scaling)
            return commit

        table.follow("analysis", analysis_follower)
    health, stage, service = cycle.stage("health"), cycle.stage("advisor"), cycle.advisor
    monitor = health.monitor if isinstance(health, HealthStage) else None
    advisor = stage if isinstance(stage, AdvisorStage) else None
    if advisor is not None:
        from exporter.advisor.advise import decision_settings, planner_for

    def engine(new: Thresholds) -> Callable[[], None]:
        settings = decision_settings(config.advisor, new) if advisor else None  # ConfigError: refused
        # the ledger of delivered plans outlives the table (/v1/advice's saving)
        planner = planner_for(config.advisor, new, advisor.planner) if advisor else None
        health_table = health_settings(config.advisor, new)

        def commit() -> None:
            if advisor is not None and settings is not None and planner is not None:
                advisor.advisor.settings = settings
                advisor.planner = planner
                if service is not None:
                    service.planner = planner
            if monitor is not None:
                monitor.retable(health_table.verdicts, health_table.remediation, health_table.stragglers)
        return commit

    table.follow("advisor", engine)


def log_families() -> list[Family]:
    """The log lines not written (exporter/logs.py): the process's, not a stage's."""
    from exporter import logs, metrics

    return [metrics.LOG_LINES_DROPPED_TOTAL.family([
        ((("reason", reason),), float(count)) for reason, count in logs.not_written().items()])]
