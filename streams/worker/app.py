"""Builds the faust app of a worker, and nothing else.

faust carries what it does well: the worker lifecycle, the low-volume entity agent, timers
and the web server. The engagement hot path is `streams.ingest.loop` on confluent-kafka, run by
`IngestService` in its own thread (faust tops out near 10k events/s per agent here).
"""
from __future__ import annotations

import asyncio
import logging
import os
import signal
from pathlib import Path

import faust
import mode

from hirflow.streams.ingest import knowledge
from hirflow.streams.api import web
from hirflow.streams.config import HirflowConfig
from hirflow.streams.worker.runtime import WorkerRuntime

log = logging.getLogger(__name__)


def _broker_url(bootstrap: str) -> str:
    return ";".join(f"kafka://{h.strip()}" for h in bootstrap.split(",") if h.strip())


def _credentials(client: dict[str, str]):
    """faust's view of the librdkafka security settings the ingest loop also uses."""
    import ssl
    mech = client.get("sasl.mechanism") or client.get("sasl.mechanisms")
    # the same CA file librdkafka uses (a mounted Secret in Kubernetes), else the system CAs
    context = ssl.create_default_context(cafile=client.get("ssl.ca.location") or None)
    if mech:
        proto = client.get("security.protocol", "SASL_SSL").upper()
        return faust.SASLCredentials(
            username=client.get("sasl.username"), password=client.get("sasl.password"),
            mechanism=mech, ssl_context=context if "SSL" in proto else None)
    if client.get("security.protocol", "").upper() == "SSL":
        return faust.SSLCredentials(context)
    return None


def build_app(cfg: HirflowConfig, runtime: WorkerRuntime) -> faust.App:
    app = _faust_app(cfg)
    app.service(_ingest_service(app, runtime))
    knowledge.register(app, runtime)
    web.register(app, runtime)

    @app.timer(cfg.worker.metrics_interval_s)
    async def gauges() -> None:
        runtime.update_gauges()

    return app


def _faust_app(cfg: HirflowConfig) -> faust.App:
    w, k = cfg.worker, cfg.kafka
    return faust.App(
        # own group per worker: each reads every entity partition. With a change log the
        # group is per worker set too: a worker that gained partitions reads the entities
        # again from the start, keeping what is newer than the restored offsets
        f"{w.app_id}-{w.index}" + (f"-of-{w.count}" if w.changelog else ""),
        broker=_broker_url(k.bootstrap),
        broker_credentials=_credentials(k.client),
        store="memory://",
        datadir=str(Path(cfg.graph.path).parent / "faust"),
        web_host=w.web_host,
        web_port=w.web_port,
        web_bind=w.web_host,
        topic_partitions=k.partitions,
        topic_allow_declare=False,      # `hirflow topics create` owns topic configs
        broker_session_timeout=k.session_timeout_ms / 1000,
        broker_heartbeat_interval=max(0.5, k.session_timeout_ms / 6000),
        consumer_auto_offset_reset="earliest",
    )


def _ingest_service(app: faust.App, runtime: WorkerRuntime) -> type[mode.Service]:
    """The service that runs the ingest and refresh threads for the app's lifetime and stops
    the worker when either fails or a new plan asks for a restart."""

    class IngestService(mode.Service):
        """Runs the confluent-kafka ingest loop in a thread for the app's lifetime."""

        async def on_start(self) -> None:
            runtime.start_ingest()
            # loading a checkpoint and the serving index can take seconds: off the event loop
            await asyncio.get_running_loop().run_in_executor(None, runtime.start_refresh)

        async def on_stop(self) -> None:
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(None, runtime.stop_refresh)
            await loop.run_in_executor(None, runtime.stop_ingest)

        @mode.Service.task
        async def _watch(self) -> None:
            while not self.should_stop:
                if runtime.error is not None:
                    log.error("ingest failed, stopping worker: %s", runtime.error)
                    app._crash(runtime.error)
                    return
                if runtime.refresh is not None and runtime.refresh.error is not None:
                    log.error("refresh failed, stopping worker: %s", runtime.refresh.error)
                    app._crash(runtime.refresh.error)
                    return
                if runtime.replan is not None:
                    # the graceful stop of SIGTERM (ingest and refresh commit); `hirflow
                    # worker` then starts again with the plan's count (`streams.scaleout.plan`)
                    log.info("stopping for the new plan of %d workers", runtime.replan.count)
                    os.kill(os.getpid(), signal.SIGTERM)
                    return
                await self.sleep(1.0)

    return IngestService
