"""``autotune schedule add|list|remove`` and ``autotune scheduler``
(docs/nightly.md#8-the-scheduler)."""

from __future__ import annotations

import signal
import sys
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import Annotated

import typer

from autotune.cli._app import app, print_json
from autotune.cli.database import StorageOpt, open_store
from autotune.nightly.job_config import load_nightly_config
from autotune.nightly.job_records import ScheduleRecord, add_schedule, remove_schedule, schedules

__all__ = ["add", "list_cmd", "remove", "scheduler"]

schedule_app = typer.Typer(help="Schedules that `autotune scheduler` runs.", no_args_is_help=True)
app.add_typer(schedule_app, name="schedule")


@schedule_app.command("add")
def add(
    name: str,
    cron: Annotated[str, typer.Option("--cron", help='cron expression, e.g. "0 2 * * *"')],
    config: Annotated[str, typer.Option("--config", help="the nightly config it runs")],
    timezone: Annotated[
        str, typer.Option("--timezone", help="the cron expression's time zone")
    ] = "UTC",
    storage: StorageOpt = None,
) -> None:
    """Store a schedule: run `autotune nightly --config FILE` at each cron time."""
    from autotune.nightly.scheduler import check_cron, check_timezone, next_fire

    check_cron(cron)
    check_timezone(timezone)
    load_nightly_config(config)  # a config that does not parse is refused now, not at 2 am
    path = str(Path(config).resolve())
    store = open_store(storage)
    try:
        now = datetime.now(UTC)
        add_schedule(store, ScheduleRecord(name, cron, path, now, timezone))
    finally:
        store.close()
    print(
        f"schedule {name}: {cron} ({timezone}) runs {path}; "
        f"next {next_fire(cron, timezone, now):%Y-%m-%d %H:%M} UTC"
    )


@schedule_app.command("list")
def list_cmd(
    storage: StorageOpt = None,
    json_out: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
) -> None:
    """The stored schedules, with their last run and next fire time."""
    from autotune.nightly.scheduler import next_fire

    store = open_store(storage, create=False)
    try:
        rows = schedules(store)
    finally:
        store.close()
    now = datetime.now(UTC)
    if json_out:
        print_json(
            [
                {
                    "name": s.name,
                    "cron": s.cron,
                    "timezone": s.timezone,
                    "config": s.config_path,
                    "last_fire_at": s.last_fire_at.isoformat() if s.last_fire_at else None,
                    "last_exit_code": s.last_exit_code,
                    "next_fire_at": next_fire(s.cron, s.timezone, now).isoformat(),
                }
                for s in rows
            ]
        )
        return
    if not rows:
        print("no schedules (add one with `autotune schedule add NAME --cron ... --config ...`)")
    for s in rows:
        last = (
            f"last {s.last_fire_at:%Y-%m-%d %H:%M} (exit {s.last_exit_code})"
            if s.last_fire_at
            else "never run"
        )
        nxt = next_fire(s.cron, s.timezone, now)
        print(
            f"{s.name}  {s.cron} ({s.timezone})  {s.config_path}  {last}  "
            f"next {nxt:%Y-%m-%d %H:%M} UTC"
        )


@schedule_app.command("remove")
def remove(name: str, storage: StorageOpt = None) -> None:
    """Remove a schedule."""
    store = open_store(storage, create=False)
    try:
        remove_schedule(store, name)
    finally:
        store.close()
    print(f"schedule {name} removed")


@app.command("scheduler")
def scheduler(
    storage: StorageOpt = None,
    once: Annotated[bool, typer.Option("--once", help="run what is due now, then exit")] = False,
) -> None:
    """Run the stored schedules (long-running; exactly one per database)."""
    from autotune.nightly.scheduler import Scheduler

    store = open_store(storage)
    sched = Scheduler(store)

    def stop(signum: int, _frame: FrameType | None) -> None:
        sched.stop()

    old = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        sched.serve(
            once=once,
            on_hold=None
            if once
            else lambda: print(
                "scheduler: active (it holds this database's scheduler lock); Ctrl-C stops it",
                file=sys.stderr,
                flush=True,
            ),
        )
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        store.close()
