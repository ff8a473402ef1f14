"""The `hirflow` command line. Config: defaults < --config file < HIRFLOW_* env < flags."""
from __future__ import annotations

import json
import logging
import signal
import sys
import time
from pathlib import Path

import click

from hirflow.state.config import ConfigError, as_dict
from hirflow.streams import clients
from hirflow.streams import config as config_mod
from hirflow.streams import logs
from hirflow.trainer.train_settings import OBJECTIVES

log = logging.getLogger("hirflow")


_debug = [False]                  # --debug: expected errors keep their traceback
FILE_FORMATS = ["jsonl", "csv", "taobao", "online-retail", "ciaodvd", "yoochoose"]   # replay.FORMATS


def _parse_sets(sets: tuple[str, ...]) -> dict[str, str]:
    out = {}
    for s in sets:
        key, sep, value = s.partition("=")
        if not sep:
            raise click.BadParameter(f"--set expects key=value, got {s!r}")
        out[key.strip()] = value
    return out


class Ctx:
    def __init__(self, config_file, sets, flags, log_level, log_format):
        self.config_file, self.sets, self.flags = config_file, sets, flags
        self.log_level, self.log_format = log_level, log_format

    def config(self, **more) -> config_mod.HirflowConfig:
        overrides = {**self.sets, **{k: v for k, v in {**self.flags, **more}.items() if v is not None}}
        try:
            cfg = config_mod.load(file=self.config_file, overrides=overrides)
        except ConfigError as exc:
            raise click.UsageError(str(exc)) from None
        logs.setup(self.log_level or cfg.worker.log_level, self.log_format or cfg.worker.log_format)
        return cfg


def config_flag(*decls: str, key: str, **kw):
    """A command's flag that sets one config key (`--seed` sets `train.seed`): its value joins
    the config overrides (above file and env) instead of the command's parameters."""
    def store(ctx: click.Context, _param, value):
        if value is not None:
            ctx.find_object(Ctx).flags[key] = value
    kw.setdefault("default", None)
    return click.option(*decls, expose_value=False, callback=store, **kw)


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option("--config", "config_file", type=click.Path(dir_okay=False),
              help="TOML or JSON config file (also HIRFLOW_CONFIG).")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE",
              help="Override one config key, e.g. --set graph.top_k=128 (repeatable).")
@click.option("--bootstrap", help="Kafka bootstrap servers (kafka.bootstrap).")
@click.option("--state", "state_path", help="RocksDB state directory (graph.path).")
@click.option("--partitions", type=int, help="Partitions of keyed topics (kafka.partitions).")
@click.option("--topic-prefix", help="Prefix for every topic name (kafka.topic_prefix).")
@click.option("--log-level", type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"],
                                               case_sensitive=False))
@click.option("--log-format", type=click.Choice(["text", "json"]))
@click.option("--debug", is_flag=True, help="Print an expected error's traceback too.")
@click.pass_context
def cli(ctx, config_file, sets, bootstrap, state_path, partitions, topic_prefix, log_level,
        log_format, debug):
    """hirflow keeps Hierarchical Interest Representation embeddings fresh from Kafka.

    \b
    Quick start on the embedded default (broker, state, synthetic world):
      hirflow demo
    Pieces:
      hirflow broker                 # embedded Kafka-compatible broker on 127.0.0.1:9092
      hirflow topics create          # create hirflow.* topics (idempotent)
      hirflow worker                 # the stream worker: ingest, refresh, query API, /metrics
      hirflow scale N                # N workers share the partitions from now (change log)
      hirflow subscribe              # print token changes as they are published
      hirflow synth --produce        # stream a synthetic ads world with planted interests
      hirflow replay FILE            # produce JSONL / CSV / Taobao UserBehavior files
    """
    _debug[0] = debug
    flags = {"kafka.bootstrap": bootstrap, "graph.path": state_path,
             "kafka.partitions": partitions, "kafka.topic_prefix": topic_prefix}
    ctx.obj = Ctx(config_file, _parse_sets(sets), flags, log_level, log_format)


@cli.command()
@click.option("--port", default=9092, show_default=True, help="Loopback port to listen on.")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.pass_obj
def broker(obj: Ctx, port, host):
    """Run the embedded tansu broker in the foreground until Ctrl-C."""
    from hirflow.streams.broker import EmbeddedBroker
    obj.config()
    b = EmbeddedBroker(port=port, host=host).start()
    click.echo(f"embedded broker listening on {b.bootstrap} (in-memory storage; Ctrl-C stops)")
    _wait_for_signal(lambda: b.proc.poll() is not None)
    b.stop()


@cli.group()
def topics():
    """Manage hirflow's Kafka topics."""


@topics.command("create")
@click.pass_obj
def topics_create(obj: Ctx):
    """Create every hirflow topic that is missing (idempotent)."""
    from hirflow.streams.topics import Topics, ensure_topics
    cfg = obj.config()
    for name, status in ensure_topics(cfg.kafka, Topics(cfg.kafka.topic_prefix)).items():
        click.echo(f"{status:8} {name}")


@cli.command()
@click.option("--index", type=int, help="This worker's index (worker.index).")
@click.option("--count", type=int, help="Number of workers (worker.count).")
@click.option("--web-port", type=int, help="Port of the query API, /health, /ready, /metrics "
                                          "(worker.web_port).")
@click.option("--checkpoint", help="Checkpoint to serve at first start (refresh.checkpoint).")
@click.option("--create-topics/--no-create-topics", default=True, show_default=True,
              help="Create missing topics before starting.")
@click.pass_obj
def worker(obj: Ctx, index, count, web_port, checkpoint, create_topics):
    """Run the stream worker: engagement ingest, entity agent, refresh loop (token changes),
    hot swap of announced checkpoints, the query API, health and metrics."""

    from hirflow.streams.scaleout import plan
    from hirflow.streams.worker.app import build_app
    from hirflow.streams.worker.runtime import WorkerRuntime
    from hirflow.streams.worker.shutdown import BoundedWorker
    from hirflow.streams.worker.waiting_page import waiting_page
    from hirflow.streams.topics import Topics, ensure_topics
    cfg = obj.config(**{"worker.index": index, "worker.count": count, "worker.web_port": web_port,
                        "refresh.checkpoint": checkpoint})
    with waiting_page(cfg.worker.web_host, cfg.worker.web_port, "waiting for the Kafka cluster"):
        clients.wait_for_cluster(cfg.kafka)      # started before its broker: wait, alive
    if create_topics:
        ensure_topics(cfg.kafka, Topics(cfg.kafka.topic_prefix))
    try:
        cfg = plan.follow_plan(cfg)          # `hirflow scale`'s count, when there is a plan
    except plan.PlanError as exc:
        raise click.ClickException(str(exc)) from None
    from hirflow.state.graph import IncompatibleStoreError
    try:
        runtime = WorkerRuntime(cfg)
    except IncompatibleStoreError as exc:
        raise click.ClickException(str(exc)) from None
    app = build_app(cfg, runtime)
    # the bootstrap servers are not logged: they may come from a Secret
    log.info("worker %d/%d, state %s, web http://%s:%d/metrics", cfg.worker.index,
             cfg.worker.count, cfg.graph.path, cfg.worker.web_host, cfg.worker.web_port)
    watcher = None
    if cfg.worker.changelog:
        watcher = plan.PlanWatcher(cfg, cfg.worker.count, lambda p: setattr(runtime, "replan", p)).start()
    try:
        worker = BoundedWorker(app, loglevel=(obj.log_level or cfg.worker.log_level).lower(),
                               override_logging=False, quiet=True)
        if not sys.stdout.isatty():
            worker.spinner = None       # its cursor codes would land in a redirected log
        worker.execute_from_commandline()
    finally:
        try:
            if watcher is not None:
                watcher.close()
            runtime.close()
        finally:
            if runtime.replan is not None:      # even when the stop failed (fenced): the
                plan.restart_in_place()         # new start settles every partition anew


@cli.command()
@click.argument("workers", type=int, required=False)
@click.pass_obj
def scale(obj: Ctx, workers):
    """Change how many workers share the partitions, while they run (needs the change log,
    worker.changelog). Each running worker stops gracefully and starts again with the new
    count: it restores the partitions it gains from the change log and drops those it loses;
    workers the plan leaves out wait until a plan includes them. Without WORKERS: print the
    current plan."""
    from hirflow.streams.scaleout import plan
    from hirflow.streams.topics import Topics, ensure_topics
    cfg = obj.config()
    if workers is None:
        current = plan.newest_plan(cfg)
        click.echo(f"plan: {current.count} workers" if current else
                   f"no plan: workers follow worker.count ({cfg.worker.count})")
        return
    ensure_topics(cfg.kafka, Topics(cfg.kafka.topic_prefix))
    try:
        plan.publish_plan(cfg, workers)
    except plan.PlanError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"plan: {workers} workers over {cfg.kafka.partitions} partitions")


@cli.command()
@click.argument("path", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--format", "fmt", type=click.Choice(FILE_FORMATS),
              help="File format (default: from the name and first line).")
@click.option("--rate", type=float, help="Pace to this many events per second.")
@click.option("--progress/--no-progress", default=True)
@click.pass_obj
def replay(obj: Ctx, path, fmt, rate, progress):
    """Produce the events of a file to hirflow.engagements / hirflow.entities."""
    from hirflow.state.events import Validator
    from hirflow.streams.tools.adapters.online_retail import Rejects
    from hirflow.streams.tools.replay import ReplayError, detect_format, produce, read_events
    cfg = obj.config()
    rejects = Rejects()
    try:
        fmt = fmt or detect_format(path)
        stats = produce(cfg, read_events(path, fmt, Validator(cfg.schema), rejects), rate=rate,
                        progress=progress)
    except ReplayError as exc:
        raise click.ClickException(str(exc)) from None
    if rejects.total:
        stats["skipped_rows"] = dict(sorted(rejects.counts.items()))
    click.echo(json.dumps(stats))


@cli.command()
@click.option("--out", type=click.Path(file_okay=False, path_type=Path),
              help="Write engagements/entities/labels JSONL files here.")
@click.option("--produce", "do_produce", is_flag=True, help="Produce straight to Kafka.")
@click.option("--events", type=int, default=100_000, show_default=True)
@click.option("--users", type=int, default=2_000, show_default=True)
@click.option("--seed", type=int, default=7, show_default=True)
@click.option("--start", default="2026-01-01", show_default=True,
              help="Event time of the first event: YYYY-MM-DD, ms since epoch, or 'now'.")
@click.option("--span-days", type=float, default=28.0, show_default=True)
@click.option("--locality", type=float, default=0.0, show_default=True,
              help="Chance that a user's 2nd/3rd interest lies under the coarse interest of its "
                   "first (0: interests drawn independently; the coarse level is then planted "
                   "only in entity texts).")
@click.option("--rate", type=float, help="With --produce: pace to events per second.")
@click.pass_obj
def synth(obj: Ctx, out, do_produce, events, users, seed, start, span_days, locality, rate):
    """Generate the synthetic ads world with planted hierarchical interests."""
    from hirflow.streams.tools.synth import SynthConfig, SynthWorld, write
    if not out and not do_produce:
        raise click.UsageError("give --out DIR, --produce, or both")
    cfg = obj.config()
    scfg = SynthConfig(seed=seed, events=events, users=users, start_ms=_parse_start(start),
                       span_days=span_days, locality=locality)
    world = SynthWorld(scfg)
    if out:
        paths = write(world, out)
        click.echo(json.dumps({k: str(v) for k, v in paths.items()}))
    if do_produce:
        from hirflow.streams.tools.replay import produce
        click.echo(json.dumps(produce(cfg, world.stream(), total=None, rate=rate)))


def _parse_start(start: str) -> int:
    if start == "now":
        return int(time.time() * 1000)
    if start.isdigit():
        return int(start)
    import datetime as dt
    try:
        d = dt.datetime.strptime(start, "%Y-%m-%d").replace(tzinfo=dt.timezone.utc)
    except ValueError:
        raise click.BadParameter(f"--start {start!r}: use YYYY-MM-DD, ms since epoch or 'now'")
    return int(d.timestamp() * 1000)


@cli.command("state")
@click.option("--node", "nodes", multiple=True, help="Show this node's stats and top edges.")
@click.option("--top", default=10, show_default=True)
@click.pass_obj
def state_cmd(obj: Ctx, nodes, top):
    """Summarise the state store (stop the worker first: RocksDB allows one writer)."""
    from hirflow.state.graph import GraphStore
    cfg = obj.config()
    with GraphStore(cfg.graph.path, cfg.schema, cfg.kafka.partitions, create=False) as store:
        r = store.reader
        click.echo(json.dumps({"nodes": r.count("nodes"), "entities": r.count("entities"),
                               "dirty": r.count("dirty"), "bytes": r.size_bytes(),
                               "offsets": {f"{t}[{p}]": o for (t, p), o in sorted(r.offsets().items())}},
                              indent=2))
        for n in nodes:
            view = r.node(n)
            click.echo(json.dumps({"node": n, "stats": None if view is None else {
                "events": view.events, "first_seen": view.first_seen, "last_seen": view.last_seen,
                "degree_out": view.degree_out, "degree_in": view.degree_in},
                "edges": [e.__dict__ for e in r.neighbors(n, k=top)]}, indent=2, default=str))


def _data_loader(cfg, input_path, fmt, entities_path):
    """cutoff -> (engagements, entities) from a file (any format `hirflow replay` reads, plus
    an optional entities file) or from the Kafka topics, read to the cutoff."""
    from hirflow.state.events import Engagement, Validator
    from hirflow.streams.tools.replay import detect_format, read_events
    from hirflow.streams.topics import Topics
    from hirflow.trainer.data import read_topic
    validator = Validator(cfg.schema)

    def from_files(cutoff):
        evs, ents = [], []
        for path, f in ((input_path, fmt), (entities_path, None)):
            if path is None:
                continue
            for e in read_events(path, f or detect_format(path), validator):
                (evs if isinstance(e, Engagement) else ents).append(e)
        return [e for e in evs if e.ts <= cutoff], [e for e in ents if e.ts <= cutoff]

    def from_kafka(cutoff):
        topics = Topics(cfg.kafka.topic_prefix)
        conf = clients.connection(cfg.kafka)
        evs = list(read_topic(conf, topics.engagements, validator, cutoff))
        ents = list(read_topic(conf, topics.entities, validator, cutoff, entities=True))
        return evs, ents

    return from_files if input_path else from_kafka


def _text_encode(enabled: bool):
    """texts -> MiniLM vectors, loading the model only when there are texts."""
    if not enabled:
        return None
    held = []

    def encode(texts):
        from hirflow.encoder.knowledge import KnowledgeModelMissing, TextEncoder
        if not held:
            try:
                held.append(TextEncoder())
            except KnowledgeModelMissing as exc:
                raise click.ClickException(str(exc)) from None
        return held[0].encode(texts)
    return encode


@cli.command()
@click.option("--input", "input_path", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Train from a file that `hirflow replay` reads instead of the Kafka topics.")
@click.option("--format", "fmt", type=click.Choice(FILE_FORMATS))
@click.option("--entities", "entities_path", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Entity file (texts for world knowledge), e.g. entities.jsonl of `hirflow synth`.")
@click.option("--cutoff", help="Use events up to this time (ms or YYYY-MM-DD; default: now).")
@config_flag("--train-share", key="train.train_share", type=float,
             help="Share of the events, in time order, used for training (then 10% validation, "
                  "the rest test) [train.train_share, 0.8].")
@config_flag("--fit-validation/--no-fit-validation", key="train.fit_validation",
             help="Fit on the training and validation windows, everything before the test "
                  "window (off: the training window only, to compare settings on validation) "
                  "[train.fit_validation, on].")
@config_flag("--window", key="train.window",
             help="Only the data of this long before the cutoff, e.g. 14d [train.window, all].")
@config_flag("--every", key="train.every",
             help="Train periodically, e.g. 1h: each round takes the data up to now and continues "
                  "the previous checkpoint (its parent) [train.every].")
@config_flag("--rounds", key="train.rounds", type=int,
             help="With --every: stop after this many rounds [train.rounds].")
@config_flag("--out", key="train.out", help="Checkpoints directory [train.out, var/checkpoints].")
@click.option("--init", "init_path", type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="Start from this checkpoint's weights; it becomes the parent.")
@click.option("--resume", is_flag=True, help="Continue the interrupted run of the same data in --out.")
@config_flag("--levels", key="encoder.levels",
             help="Prototypes per level of a new model, coarse to fine, e.g. 4,16,64 "
                  "[encoder.levels, 16,128,1024].")
@config_flag("--seed", key="train.seed", type=int, help="Training seed [train.seed, 0].")
@config_flag("--steps-per-chunk", key="train.steps_per_chunk", type=int,
             help="Most steps per pass over a 24 h chunk [train.steps_per_chunk, as many as "
                  "its events fill].")
@config_flag("--objective", key="train.objective", type=click.Choice(OBJECTIVES),
             help="softmax: in-batch sampled softmax over each batch's items (retrieval); bce: "
                  "DistMult engagement prediction against sampled negatives "
                  "[train.objective, softmax].")
@config_flag("--passes", key="train.passes", type=int,
             help="Shuffled passes over each chunk's events [train.passes, 1].")
@config_flag("--min-steps", key="train.min_steps", type=int,
             help="More passes for a small data set, to at least this many steps; 0: off "
                  "[train.min_steps, 1000].")
@config_flag("--centre-types/--no-centre-types", key="train.centre_types",
             help="Fit and assign primitives to embeddings less their node type's mean (a "
                  "hierarchy by interest, not by type); retrieval keeps the plain embedding "
                  "[train.centre_types, on].")
@config_flag("--sample-workers", key="train.sample_workers", type=int,
             help="Threads sampling views ahead of the model, 0: inline [train.sample_workers, 1].")
@config_flag("--knowledge/--no-knowledge", key="train.knowledge",
             help="Use entity texts (MiniLM world knowledge), as the worker does "
                  "[train.knowledge, on].")
@config_flag("--announce/--no-announce", key="train.announce",
             help="Announce each checkpoint on hirflow.checkpoints when it is complete "
                  "[train.announce, on].")
@click.option("--progress/--no-progress", default=True, show_default=True)
@click.pass_obj
def train(obj: Ctx, input_path, fmt, entities_path, cutoff, init_path, resume, progress):
    """Train a checkpoint on the data before its test window (strict time cutoff), once or
    periodically (--every). Settings come from the [train], [encoder] and [quantizer] config
    sections; each flag overrides the key named in brackets."""
    from hirflow.encoder.checkpoint import CheckpointError, load as load_ckpt
    from hirflow.streams.topics import Topics
    from hirflow.streams.tools.train_options import run_options
    from hirflow.trainer.publish import announce as do_announce
    from hirflow.trainer.resume import ResumeError
    from hirflow.trainer.runs import parse_duration, run_every, run_once
    from hirflow.trainer.train import NonFiniteLoss
    cfg = obj.config()
    tc = cfg.train
    out = Path(tc.out)
    try:
        opts = run_options(cfg, resume=resume, log_path=str(out / "train-log.jsonl"))
        period = parse_duration(tc.every) if tc.every else None
        parent = load_ckpt(init_path) if init_path else None
    except (ValueError, CheckpointError) as exc:
        raise click.UsageError(str(exc)) from None
    conf = clients.connection(cfg.kafka)
    topic = Topics(cfg.kafka.topic_prefix).checkpoints
    pub = (lambda path: do_announce(conf, topic, path)) if tc.announce else None
    load = _data_loader(cfg, input_path, fmt, entities_path)
    encode = _text_encode(tc.knowledge)

    def report(res):
        out_ = {"checkpoint": str(res.checkpoint), "id": res.id, "parent": res.parent,
                "events": res.events, "windows": res.windows.__dict__}
        if res.announced:
            out_["announced"] = res.announced.id
        click.echo(json.dumps(out_))

    try:
        if period is None:
            cut = _parse_start(cutoff) if cutoff else int(time.time() * 1000)
            report(run_once(load, cut, cfg.schema, opts, out, parent, encode, pub, progress))
        else:
            for res in run_every(period, load, cfg.schema, opts, out, parent, encode, pub,
                                 rounds=tc.rounds, progress=progress):
                report(res)
    except (ValueError, NonFiniteLoss, ResumeError) as exc:
        raise click.ClickException(str(exc)) from None


@cli.command()
@click.argument("checkpoint", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--input", "input_path", required=True,
              type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Events (any format `hirflow replay` reads); windows are taken from them.")
@click.option("--format", "fmt", type=click.Choice(FILE_FORMATS))
@click.option("--entities", "entities_path", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Entity file (texts): world knowledge, and the cold-start evaluation.")
@click.option("--labels", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="labels.jsonl from `hirflow synth` (planted interests) for NMI / ARI.")
@click.option("--category-labels", is_flag=True,
              help="Use `belongs_to` categories (Taobao) as the labels for NMI / ARI.")
@click.option("--train-share", type=float,
              help="Training share of the events in time order; then 10% validation (where "
                   "baselines are tuned), the rest is the test window [train.train_share, 0.8].")
@click.option("--quick-baselines", is_flag=True,
              help="One or two grid points per baseline instead of the full validation search.")
@click.option("--knowledge/--no-knowledge", default=True, show_default=True)
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=Path("var/eval"),
              show_default=True)
@click.pass_obj
def evaluate(obj: Ctx, checkpoint, input_path, fmt, entities_path, labels, category_labels,
             train_share, quick_baselines, knowledge, out):
    """Evaluate a checkpoint on the test window against baselines tuned on the validation
    window: Recall/NDCG of new items with confidence intervals, cold start, hierarchy;
    writes metrics.json and recall.png to --out."""
    from hirflow.trainer.baselines import QUICK, STANDARD
    from hirflow.trainer.data import chronological_windows, world_knowledge
    from hirflow.trainer.evaluate import TrainedOnTestWindow, category_labels as categories
    from hirflow.trainer.evaluate import evaluate as run_eval
    cfg = obj.config(**{"train.train_share": train_share})
    train_share = cfg.train.train_share
    evs, ents = _data_loader(cfg, input_path, fmt, entities_path)(2 ** 62)
    if not evs:
        raise click.ClickException(f"{input_path}: no engagement events")
    windows = chronological_windows([e.ts for e in evs], train=train_share,
                                    val=min(0.1, (1 - train_share) / 2))
    encode = _text_encode(knowledge)
    texts = later = None
    if encode is not None and ents:
        texts = world_knowledge(ents, windows.val_end - 1, encode)
        later = world_knowledge(ents, windows.end, encode)
    lab = None
    if labels:
        lab = {r["node"]: r for r in map(json.loads, labels.read_text().splitlines()) if "fine" in r}
    elif category_labels:
        lab = categories(evs)
    try:
        metrics = run_eval(checkpoint, evs, windows, cfg.schema, out, labels=lab, texts=texts,
                           later_texts=later, baselines=QUICK if quick_baselines else STANDARD)
    except TrainedOnTestWindow as exc:
        raise click.ClickException(str(exc)) from None
    for task in ("next_engagement", "deep_funnel"):
        res = metrics.get(task, {})
        if not res.get("methods"):
            continue
        click.echo(f"{task}: {res['users']} users, {res['new_positives']} new items engaged "
                   f"({res['repeat_positives']} repeats not ranked), {res['items']} candidates")
        for name, m in sorted(res["methods"].items(), key=lambda kv: -kv[1]["recall@20"]["mean"]):
            r = m["recall@20"]
            click.echo(f"  {name:22s} Recall@20 {r['mean']:.4f} [{r['ci_low']:.4f}, {r['ci_high']:.4f}]"
                       f"  NDCG@20 {m['ndcg@20']['mean']:.4f}")
        if "hirflow_vs_best_recall@20" in res:
            v = res["hirflow_vs_best_recall@20"]
            click.echo(f"  hirflow / {res['best_baseline']}: {v['ratio']:.3f} [{v['ci_low']:.3f}, {v['ci_high']:.3f}]")
    click.echo(f"all figures: {out / 'metrics.json'}, plot: {out / 'recall.png'}")


@cli.command()
@click.option("--group", default="hirflow-cli-subscriber", show_default=True,
              help="Consumer group (offsets are committed: a second run continues).")
@click.option("--from-start/--latest", default=True, show_default=True,
              help="Where a new group starts reading.")
@click.option("--count", type=int, help="Stop after this many changes.")
@click.option("--idle-stop", type=float, help="Stop after this many seconds without a change.")
@click.option("--node", "nodes", multiple=True, help="Only changes of these nodes.")
@click.pass_obj
def subscribe(obj: Ctx, group, from_start, count, idle_stop, nodes):
    """Print token changes (JSON lines), deduplicated by (node, seq)."""
    import msgspec

    from hirflow.streams.subscribe import Subscriber
    cfg = obj.config()
    n = 0
    with Subscriber(cfg, group_id=group, from_start=from_start) as sub:
        for c in sub.changes(timeout=0.5, idle_stop=idle_stop):
            if nodes and c.node not in nodes:
                continue
            click.echo(msgspec.json.encode(c).decode())
            n += 1
            if count is not None and n >= count:
                break


@cli.command()
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), required=True,
              help="Output file (.jsonl, .npz or .parquet).")
@click.option("--format", "fmt", type=click.Choice(["jsonl", "npz", "parquet"]),
              help="Default: from the file name.")
@click.option("--node", "nodes", multiple=True, help="Only these nodes (repeatable).")
@click.option("--type", "types", multiple=True, help="Only nodes of these types (repeatable).")
@click.pass_obj
def export(obj: Ctx, out, fmt, nodes, types):
    """Write embeddings, BoM tokens and assignments of the serving index (worker stopped)."""
    from hirflow.state.graph import GraphStore
    from hirflow.state.index import TokenIndex
    from hirflow.streams.tools.export import select, write
    cfg = obj.config()
    fmt = fmt or {".jsonl": "jsonl", ".npz": "npz", ".parquet": "parquet"}.get(out.suffix)
    if fmt is None:
        raise click.UsageError(f"cannot tell the format of {out}; pass --format")
    with GraphStore(cfg.graph.path, cfg.schema, cfg.kafka.partitions, create=False) as store:
        model, recs = select(TokenIndex(store), nodes, types)
        try:
            n = write(out, fmt, model, recs)
        except RuntimeError as exc:
            raise click.ClickException(str(exc)) from None
    click.echo(json.dumps({"exported": n, "model": model, "path": str(out), "format": fmt}))


@cli.command("config")
@click.option("--reference", is_flag=True,
              help="Print the reference of every key (Markdown: docs/configuration.md) instead.")
@click.option("--show-secrets", is_flag=True,
              help="Print Kafka client passwords, secrets and private keys instead of '***'.")
@click.pass_obj
def show_config(obj: Ctx, reference, show_secrets):
    """Print the effective config (after file, env and flags); secrets are masked."""
    if reference:
        from hirflow.streams.tools.config_reference import render
        click.echo(render(), nl=False)
        return
    out = as_dict(obj.config())
    if not show_secrets:
        out["kafka"]["client"] = config_mod.masked_client(out["kafka"]["client"])
        if out["worker"]["api_token"]:
            out["worker"]["api_token"] = "***"
    click.echo(json.dumps(out, indent=2, default=str))


@cli.command()
@click.option("--events", type=int, default=400_000, show_default=True,
              help="Synthetic engagement events to stream.")
@click.option("--rate", type=float, default=2_000, show_default=True, help="Events per second.")
@click.option("--duration", type=float, help="Stop after this many seconds (default: at the end).")
@click.option("--workdir", type=click.Path(file_okay=False, path_type=Path), default=Path("var/demo"),
              show_default=True)
@click.pass_obj
def demo(obj: Ctx, events, rate, duration, workdir):
    """The main job on the embedded default: broker, worker, a synthetic world streamed live."""
    from hirflow.streams.tools.demo import run_demo
    cfg = obj.config(**{"graph.path": str(workdir / "state")})
    sys.exit(run_demo(cfg, workdir, events=events, rate=rate, duration=duration,
                      log_level=obj.log_level or "WARNING"))


def _wait_for_signal(done=lambda: False) -> None:
    stop = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.append(1))
    while not stop and not done():
        time.sleep(0.2)


def _expected_errors() -> tuple[type[BaseException], ...]:
    """What an operator can meet and fix from one line: a locked or foreign store, a topic
    that does not match the config, the broker, a checkpoint, the change log."""
    from hirflow.encoder.checkpoint import CheckpointError
    from hirflow.encoder.knowledge import KnowledgeModelMissing
    from hirflow.state.graph import StoreError
    from hirflow.streams.broker import BrokerError
    from hirflow.streams.scaleout.changelog import ChangelogError
    from hirflow.streams.topics import TopicMismatchError
    return (StoreError, TopicMismatchError, BrokerError, CheckpointError, ChangelogError,
            KnowledgeModelMissing)


def main() -> None:
    """The CLI; an expected error ends it with one line and exit code 2 (`--debug`: with its
    traceback)."""
    try:
        cli.main(prog_name="hirflow")
    except _expected_errors() as exc:
        if _debug[0]:
            raise
        click.echo(f"hirflow: error: {exc}", err=True)
        sys.exit(2)


if __name__ == "__main__":
    main()
